"""The trained models' optimizer, schedule and memory knobs (AlgoConfig's ``optim`` section): each is a flag, a
YAML key and a --grpo-config key, with the meaning transformers' TrainingArguments / TRL give it.

The schedule's unit is the run's step (``step`` in metrics.jsonl, ``step_N`` checkpoints): the ``--ppo-epochs``
optimizer steps of one trainer step share its learning rate. The formulas: coati/plugins/optim.py.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from coati.config.errors import require
from coati.plugins.optim import LR_SCHEDULES
from coati.utils.dataclass_cli import option


@dataclass(frozen=True)
class OptimConfig:
    lr_scheduler: str = option(
        "constant", "learning-rate schedule over the run's steps after the warm-up: constant, linear (to 0 at the "
                    "last step) or cosine (half a cosine to 0); transformers' get_*_schedule_with_warmup",
        choices=LR_SCHEDULES, resolved=True)
    lr_warmup_steps: int = option(0, "steps of linear warm-up from 0 to -lr (0: --lr-warmup-ratio decides)",
                                  resolved=True)
    lr_warmup_ratio: float = option(0.0, "warm-up as a fraction of the run's steps, rounded up; used when "
                                         "--lr-warmup-steps is 0", resolved=True)
    weight_decay: float = option(0.0, "AdamW's decoupled weight decay on matrices (projections, embeddings, LM "
                                      "head); biases and norm weights get none, as in transformers' Trainer",
                                 resolved=True)
    gradient_checkpointing: bool = option(
        False, "recompute each decoder layer's activations in backward instead of keeping them (HF "
               "gradient_checkpointing_enable): less activation memory, about one more forward per step; every "
               "plugin but colossalai-hybrid", resolved=True)
    max_steps: int = option(0, "end the run after this many trainer steps (evaluation and a checkpoint at the end); "
                               "producers generate only the rounds those steps need. 0: the epochs decide",
                            resolved=True)

    def schedule_horizon(self, planned_steps: int) -> int:
        """The steps the learning-rate schedule spans: --max-steps when it ends the run sooner."""
        return min(planned_steps, self.max_steps) if self.max_steps > 0 else planned_steps

    def or_defaults(self) -> "OptimConfig":
        """These options with those not given (None: a resolved flag left out) at their defaults, for a command
        with no preset to resolve them (the SFT/RM stages)."""
        return replace(self, **{f.name: f.default for f in fields(self) if getattr(self, f.name) is None})

    def check(self, plugin) -> None:
        """One line per bad knob, against the trainer ``plugin``'s row (the RL run's and a stage's alike)."""
        require(self.lr_scheduler in LR_SCHEDULES,
                f"--lr-scheduler must be one of {', '.join(LR_SCHEDULES)}, got {self.lr_scheduler!r}")
        require(self.lr_warmup_steps >= 0, f"--lr-warmup-steps must be >= 0, got {self.lr_warmup_steps}")
        require(0 <= self.lr_warmup_ratio < 1, f"--lr-warmup-ratio must lie in [0, 1), got {self.lr_warmup_ratio}")
        require(self.weight_decay >= 0, f"--weight-decay must be >= 0, got {self.weight_decay}")
        require(self.max_steps >= 0, f"--max-steps must be >= 0 (0: the epochs decide), got {self.max_steps}")
        require(not self.gradient_checkpointing or plugin.gradient_checkpointing,
                f"--gradient-checkpointing is not available with {plugin.name} (its shardformer replaces the layers' "
                "forward): drop it, or use --plugin torch")
