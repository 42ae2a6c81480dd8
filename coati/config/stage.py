"""Options of the supervised stages (``coati sft``, ``coati rm``): one dataclass each, whose fields are also the
flags and the YAML keys (coati/utils/dataclass_cli.py). Short aliases follow rl_example.py's (ColossalChat's).

Checks raise ``ConfigError`` with one line naming the problem and the fix, before any model or data is read
(``validate``) or before any training (``check_given_inputs`` in coati/rlhf/cli.py reads the files).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from coati.config.errors import ConfigError, require
from coati.config.health import HealthSettings, parse_health
from coati.config.layout import TrainerLayout
from coati.config.lora import LoraConfig
from coati.config.optim import OptimConfig
from coati.config.run import SAVE_INTERVAL, check_wait_scale, wait_scale_option
from coati.config.user_plugins import load_user_plugins
from coati.utils.dataclass_cli import option
from coati.utils.gguf import GGUF_FILE_HELP
from coati.utils.user_parts import UserParts

# Defaults that differ between the embedded demo (no --model) and a user's model (TRL/OpenRLHF-like values).
DEMO_LR = {"sft": 1e-3, "rm": 5e-4}
MODEL_LR = {"sft": 2e-5, "rm": 9e-6}
# --health keys of the one monitor that applies to a stage (launcher/health.stage_monitors)
STAGE_HEALTH_KEYS = ("grad_spike", "window", "quiet_steps")


@dataclass(frozen=True)
class StageConfig(TrainerLayout):
    """The trainer group's layout (-t/-tp/-pp/-zero/--plugin/--precision, as ``coati train`` spells it) and the
    stage's own options."""

    model: str | None = option(None, "HF model to start from: a local directory, a hub name ORG/NAME or a .gguf "
                                     "file (default: the embedded tiny model: untrained for sft, the demo's "
                                     "warm-started one for rm)", "-m")
    gguf_file: str | None = option(None, GGUF_FILE_HELP)
    dataset: str | None = option(None, "training rows: .jsonl, .json list, .parquet or save_to_disk directory "
                                       "(default: generated from the demo's addition task)", "-d")
    eval_dataset: str | None = option(None, "held-out rows in the same format (default: --eval-fraction of -d "
                                            "held out)", "-ed")
    eval_fraction: float = option(0.05, "fraction of -d held out when no -ed is given (0: none)")
    project: str = option("", "run name: outputs go to <save-dir>/<project>/ (default: the stage's name)", "-p")
    save_dir: str = option("runs", "run outputs: <save-dir>/<project>/{metrics.jsonl,final/}", "-sd")
    epochs: int = option(1, "passes over the training rows", "-e", "--num-episodes")
    batch_size: int = option(32, "rows per optimizer step, all data-parallel trainers together", "-bs")
    micro_batch_size: int = option(8, "rows per forward/backward on one trainer", "-tmbs", "--train-microbatch-size")
    learning_rate: float | None = option(None, "AdamW learning rate (default: 1e-3 sft / 5e-4 rm on the embedded "
                                               "model, else 2e-5 sft / 9e-6 rm)", "-lr")
    max_grad_norm: float = option(1.0, "gradient clipping (0: off)")
    max_length: int = option(512, "rows longer than this many tokens (prompt + response) are skipped and counted",
                             "-ml")
    system_prompt: str = option("", "system prompt added to every prompt (chat-template models)", "-s")
    seed: int = option(42, "seed for initialisation, data order and the held-out split")
    eval_interval: int = option(0, "also evaluate every N steps (0: before and after training only)", "-ei")
    save_interval: int = option(SAVE_INTERVAL, "save a checkpoint (trainer state, resumable with --resume latest) "
                                               "every N steps, replacing the previous one (0: none; the final "
                                               "model is always written)", "-si")
    resume: str | None = option(None, "continue from a step_N checkpoint of this stage (or the newest under "
                                      "<save-dir>/<project>); the layout (-t/-tp/-pp/-zero) may differ",
                                metavar="PATH|latest")
    progress_bar: bool = option(True, "a progress bar while training", "--progress-bar", flag="--progress")
    wait_scale: float = wait_scale_option()  # -t > 1: how long the driver waits for its trainer ranks
    health: str | None = option(None, "the gradient-spike warning's thresholds as coati train's --health takes them: "
                                      f"{', '.join(STAGE_HEALTH_KEYS)} (0 turns it off), or off",
                                metavar="KEY=VALUE,...|off")
    lora: LoraConfig = LoraConfig()  # adapters instead of full fine-tuning (--lora-rank); the final model is merged
    # the RL run's schedule, warm-up, weight decay, gradient checkpointing and --max-steps (over the stage's steps)
    optim: OptimConfig = OptimConfig()
    parts: UserParts = UserParts()  # --plugins: imported by the driver and every rank before anything is built

    stage = "stage"
    # `coati train` spells these with another meaning (its -tbs counts prompts per data-parallel rank)
    retired_flags = {"-tbs": "coati train's -tbs counts prompts per trainer; here -bs/--batch-size counts rows per "
                             "step, all trainers together"}

    def __post_init__(self):
        object.__setattr__(self, "optim", self.optim.or_defaults())  # frozen: the flags left out at their defaults

    @property
    def embedded(self) -> bool:
        return self.model is None

    @property
    def lr(self) -> float:
        if self.learning_rate is not None:
            return self.learning_rate
        return (DEMO_LR if self.embedded else MODEL_LR)[self.stage]

    @property
    def run_dir(self) -> str:
        return os.path.join(self.save_dir, self.project or self.stage)

    @property
    def health_settings(self) -> HealthSettings | None:
        """--health's thresholds; None: off."""
        return parse_health(self.health)

    @property
    def rows_per_micro_batch(self) -> int:
        """Sequences per forward pass (a preference pair is two)."""
        return self.micro_batch_size


@dataclass(frozen=True)
class SFTConfig(StageConfig):
    stage = "sft"


@dataclass(frozen=True)
class RMConfig(StageConfig):
    batch_size: int = option(32, "preference pairs per optimizer step, all data-parallel trainers together", "-bs")
    micro_batch_size: int = option(8, "preference pairs per forward/backward on one trainer (2 sequences each)",
                                   "-tmbs", "--train-microbatch-size")
    stage = "rm"

    @property
    def rows_per_micro_batch(self) -> int:
        return 2 * self.micro_batch_size


def validate(config: StageConfig) -> None:
    """Cheap checks of the options themselves, after --plugins is imported (a bad entry: one line)."""
    load_user_plugins(config.parts.plugins)
    for flag, value in (("-e/--epochs", config.epochs), ("-bs/--batch-size", config.batch_size),
                        ("-tmbs/--micro-batch-size", config.micro_batch_size), ("-ml/--max-length", config.max_length)):
        require(value >= 1, f"{flag} must be at least 1, got {value}")
    require(config.lr > 0, f"-lr/--learning-rate must be > 0, got {config.lr}")
    require(config.max_grad_norm >= 0, f"--max-grad-norm must be >= 0 (0: off), got {config.max_grad_norm}")
    require(0 <= config.eval_fraction < 1, f"--eval-fraction must lie in [0, 1), got {config.eval_fraction}")
    require(config.eval_interval >= 0, f"-ei/--eval-interval must be >= 0, got {config.eval_interval}")
    require(config.save_interval >= 0, f"-si/--save-interval must be >= 0 (0: none), got {config.save_interval}")
    check_wait_scale(config.wait_scale)
    settings = config.health_settings
    if settings is not None:
        others = [f.name for f in dataclasses.fields(settings)
                  if f.name not in STAGE_HEALTH_KEYS and getattr(settings, f.name) != f.default]
        require(not others, f"--health: {', '.join(others)}: no such monitor in coati {config.stage}; its keys: "
                            f"{', '.join(STAGE_HEALTH_KEYS)}")
    config.check()
    config.optim.check(config.plugin_spec)
    dp = config.dp_size
    require(config.batch_size % dp == 0,
            f"-bs ({config.batch_size}) must be a multiple of the {dp} data-parallel trainers: each trains an equal "
            "share")
    share = config.batch_size // dp
    require(share >= config.micro_batch_size,
            f"-bs / data-parallel trainers ({share}) must be >= -tmbs ({config.micro_batch_size})")
    pp = config.pipeline_parallel_size
    require(pp == 1 or -(-share // config.micro_batch_size) >= pp,
             f"-pp {pp} needs at least {pp} micro-batches per step on each trainer: -bs / data-parallel trainers "
             f"/ -tmbs = {-(-share // config.micro_batch_size)}; lower -tmbs")
    if config.stage == "rm":
        # the scalar head is not in the pipeline stage builders or ColossalAI's causal-LM shard policies
        require(config.pipeline_parallel_size == 1 and config.tensor_parallel_size == 1,
                 "the reward model trains with data parallelism and FSDP2/ZeRO (-t, -zero); the -tp/-pp stage and "
                 "shard policies only know the LM head, not its scalar head: drop -tp/-pp")
    config.check_lora(config.lora)
