"""What one training step asks of an algorithm. The step is the same for every algorithm: the rollout feed
(rollout_feed.py) draws groups and splits them into data-parallel shares, the learner (learner.py) trains every
role for ``ppo_epochs``, the weight publisher publishes. At these points they hand over to the algorithm object
its family names (consumer.STEP_ALGORITHMS, keyed by the advantage estimator's family,
config.algo.estimator_family):

- ``select_groups`` at every draw: the groups worth training on (DAPO's accuracy filter), and counters;
- ``round_tensors`` once per round with round-level minibatches: what needs whole groups (advantages);
- ``build_batches`` once per step: this rank's minibatches with advantages, masks, normalisers and whatever the
  losses read (reference logprobs, a critic's values and returns);
- ``objective``: the policy's loss (objective.py, the same for every family), whose ``loss`` is the function the
  policy's plugin calls per micro-batch and whose ``begin_epoch`` starts each ppo epoch;
- ``rollout_tensors`` when the rollout log is due: the shaped rewards, advantages and masks the loss used;
- ``finish_step``: the step's own metrics (and e.g. the KL controller's update).

An algorithm sees the trainer group only through a ``StepContext`` (this rank, the data-parallel layout, the pad
id, the sum over ranks, adding a role), never the trainer itself. A family adds the models it trains beside the
policy as roles (``context.add_role``: PPO's critic); the pure math it runs (reward shaping, advantages, masks,
losses) is chosen by name from coati.algorithm's registries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from coati.rollout.group import RolloutGroup
from coati.trainer.objective import PolicyObjective


@dataclass(frozen=True)
class StepContext:
    """What an algorithm may ask of the trainer group."""
    config: object  # the run's RLConfig
    rank: int
    dp_size: int
    dp_rank: int
    pad_id: int
    policy_plugin: object  # the policy's TrainerPlugin: a LoRA policy's also serves the KL reference
    reduce: Callable  # (totals, summed=(), maxima=()) -> the totals over every rank (plugins.dist.all_reduce_stats)
    add_role: Callable  # (name, model, learning_rate, loss_fn, trained_modules=()) -> TrainedModel (roles.py)


class StepAlgorithm:
    # Statistics that are counts (summed over data-parallel ranks), and maxima (the largest over micro-batches,
    # epochs and ranks); the others are normalised (summed over micro-batches, averaged over ranks and epochs).
    summed_stats: tuple[str, ...] = ()
    max_stats: tuple[str, ...] = ()
    # Whether rows without a token in the loss may skip the forward and backward (the loss gives them no gradient:
    # coati/algorithm/idle_rows.py); the factor that turns the step's normalised statistics, then sums over the
    # rows trained, into their mean over those rows (build_batches sets it each step), and the loss's statistics
    # that need no such factor (the rows left out add nothing to them: the loss itself, the clip fractions).
    skip_idle: bool = False
    stats_scale: float = 1.0
    unchanged_stats: frozenset = frozenset()

    def __init__(self, context: StepContext, objective: PolicyObjective):
        """Called in the trainer's setup once the policy role exists (collective: it may add roles)."""
        self.context, self.config, self.objective = context, context.config, objective
        self.step_stats: dict[str, float] = {}

    def select_groups(self, groups: list[RolloutGroup]) -> tuple[list[RolloutGroup], dict]:
        """The groups worth training on and counters to add up per step. Must be deterministic: every rank of
        the group runs it on the same groups and must agree."""
        return groups, {}

    def build_batches(self, share: list[RolloutGroup], kept: list[RolloutGroup], padding: int,
                      rows=None) -> list[dict[str, torch.Tensor]]:
        """Collated minibatches of ``tMbs * G`` samples of this rank's ``share`` with what the losses need.

        ``kept``: everything the whole trainer group trains on this step (for normalisers that cover the
        step's batch); the last ``padding`` units of ``share`` are placeholders that must not reach the loss.
        The units are whole groups, or with round-level minibatches sample views (groups of one response,
        coati.trainer.round_batches) and ``rows`` (a ``RoundRows``): ``round_tensors`` of the whole round and
        the round's sample indices behind ``share`` and ``kept``.
        Called once per step: everything computed here (e.g. reference logprobs) serves every ppo epoch.
        """
        raise NotImplementedError

    def round_tensors(self, groups: list[RolloutGroup]) -> dict[str, torch.Tensor]:
        """Per-sample tensors of a round that need whole groups (e.g. group-relative advantages), computed once
        when the round is drawn, before its samples are split into steps."""
        return {}

    def minibatch_units(self, rows) -> int:
        """Units per minibatch: ``tMbs`` whole groups, or ``tMbs * G`` sample views (``rows`` given)."""
        batch = self.config.batch
        return batch.train_minibatch_size * (1 if rows is None else batch.num_generations)

    def rollout_tensors(self, kept: list[RolloutGroup]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """For the rollout logs: (shaped rewards, advantages, sample loss mask), [len(kept), G], as the loss
        used them."""
        raise NotImplementedError

    def finish_step(self, metrics: dict) -> None:
        """Add the step's own metrics (those ``build_batches`` set; none for a skipped step) to the step's."""
        metrics.update(self.step_stats)
        self.step_stats = {}

    def state(self) -> dict:
        """The algorithm's own state a checkpoint keeps (plain values, equal on every rank)."""
        return {}

    def load_state(self, state: dict) -> None:
        """Restore what ``state`` returned."""
