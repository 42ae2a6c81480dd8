"""The trained models' optimizer, schedule and memory knobs (AlgoConfig's ``optim`` section): each is a flag, a
YAML key and a --grpo-config key, with the meaning transformers' TrainingArguments / TRL give it.

The schedule's unit is the run's step (``step`` in metrics.jsonl, ``step_N`` checkpoints): the ``--ppo-epochs``
optimizer steps of one trainer step share its learning rate. The formulas: coati/plugins/optim.py.
"""

from __future__ import annotations

from dataclasses import dataclass

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
