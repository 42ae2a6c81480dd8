"""One typed configuration tree for a run (RLConfig): its parts are the files beside this one; the start-up
checks are validate.py."""

from __future__ import annotations

from dataclasses import dataclass, field

from coati.config.algo import AlgoConfig
from coati.config.batch import BatchConfig
from coati.config.data import DataConfig, ModelConfig
from coati.config.env import EnvConfig
from coati.config.layout import ParallelConfig
from coati.config.run import RunConfig
from coati.config.sampling import SamplingParams
from coati.utils.user_parts import UserParts


@dataclass(frozen=True)
class RLConfig:
    model: ModelConfig
    data: DataConfig
    sampling: SamplingParams
    parallel: ParallelConfig = ParallelConfig()
    batch: BatchConfig = BatchConfig()
    algo: AlgoConfig = AlgoConfig()
    run: RunConfig = RunConfig()
    episodes: EnvConfig = EnvConfig()  # multi-turn episodes with an environment (--env); off by default
    parts: UserParts = UserParts()  # a user's own parts, imported (--plugins) or shipped into every process
    # Sampling used for held-out evaluation: (name, params) pairs, all scored with the training reward.
    eval_sampling: tuple[tuple[str, SamplingParams], ...] = field(default=())
    # The option values by dest it was built from (flags, --config, defaults; before the situation's defaults):
    # a checkpoint stores them, so that --resume rebuilds this config with only the flags given again changed.
    options: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def steps_per_sync(self) -> int:
        """Trainer steps between two weight syncs: one round (every inferencer's and the learner's groups)."""
        return self.groups_per_sync // (self.parallel.dp_size * self.batch.train_batch_size)

    @property
    def groups_per_sync(self) -> int:
        """Groups the trainer group draws between two weight syncs: one round of every producer (with --colocate:
        of every trainer rank), plus the
        learner's ``learner_chunk_size`` groups.

        Equal to steps_per_sync * dp * tbs without filtering; dynamic batching syncs on this count, not on steps.
        """
        return self.parallel.rollout_sources * self.batch.inference_batch_size + self.algo.learner_chunk_size

    def run_length(self, rounds: int) -> tuple[int, int]:
        """(rounds the producers generate, groups the trainer group draws in all) for a data plan of ``rounds``
        rounds: all of them, or with --max-steps only the groups of that many steps and the rounds holding them."""
        groups = rounds * self.groups_per_sync
        max_steps = self.algo.optim.max_steps
        if max_steps > 0:
            groups = min(groups, max_steps * self.parallel.dp_size * self.batch.train_batch_size)
        return min(rounds, -(-groups // self.groups_per_sync)), groups

    @property
    def engine_adapters(self):
        """The LoRA settings the inference engines build their adapters with: a weight version is then the
        adapter tensors alone. None without LoRA, with --lora-sync merged (coati/config/lora_sync.py decides
        ``auto`` as a run starts) or when the engine takes full weights only (each version is merged into full
        weights first: ``merges_adapters``)."""
        lora = self.model.lora
        if not lora.enabled or self.model.lora_sync == "merged":
            return None
        return lora if self.parallel.backend_spec.takes_adapters_of_rank(lora.lora_rank) else None

    @property
    def merges_adapters(self) -> bool:
        return self.model.lora.enabled and self.engine_adapters is None

    @property
    def schedule(self):
        """The rollout protocol (coati.cluster.schedule): which version a round needs, when to publish."""
        from coati.cluster.schedule import RolloutSchedule

        return RolloutSchedule.for_run(self.parallel.rollout_sources, self.batch.inference_batch_size,
                                       self.algo.learner_chunk_size, self.parallel.max_staleness)
