"""The learner: one training step, read top to bottom in ``Learner.train_step``.

    this rank's share of the step (StepWork, from rollout_feed.py)
      -> the algorithm's minibatches (tensors: advantages, masks, normaliser, reference logprobs)
      -> every role's learning rate for this step (a pure function of ``TrainState.step``)
      -> ppo_epochs x (minibatch x micro-batches -> plugin.forward_backward(role's loss) ; plugin.optimizer_step)
      -> statistics reduced over the trainer group -> metrics

Every epoch trains on the same minibatches in the same order (``ppo_epochs`` optimizer steps, gradients
accumulating over each epoch's minibatches). Nothing here draws, publishes or talks to Ray: the consumer wires
the feed, this and the weight publisher together (consumer.py), and a test can drive it with plain tensors.

The same step trains the SFT/RM stages (stage_rank.py): their feed and task loss are a ``StepAlgorithm`` of
their own (supervised.py), with the stage's settings and its way of cutting micro-batches (``split``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from coati.config.optim import OptimConfig
from coati.layouts.rule import Choice, choose_layout, exact_from, layouts_to_check, situation_of
from coati.plugins.dist import agree_max
from coati.trainer.roles import ACTOR, TrainedModel, attention_of, grad_norm_name
from coati.trainer.step_algorithm import StepAlgorithm, StepContext
from coati.trainer.step_data import StepWork
from coati.trainer.train_state import TrainState


Split = Callable[[dict], list[dict]]  # a minibatch -> this rank's micro-batches of it


@dataclass(frozen=True)
class LearnerSettings:
    """What the learner reads of a run's options: an RL run's (``of_run``), or an SFT/RM stage's."""
    epochs: int = 1  # optimizer steps per train_step, each over all of the step's minibatches
    max_grad_norm: float = 1.0  # gradient clipping (0: off)
    optim: OptimConfig = OptimConfig()  # the learning-rate schedule

    @classmethod
    def of_run(cls, config) -> "LearnerSettings":
        return cls(config.algo.ppo_epochs, config.algo.max_grad_norm, config.algo.optim)


class Learner:
    def __init__(self, settings: LearnerSettings, state: TrainState, roles: dict[str, TrainedModel],
                 algorithm: StepAlgorithm, context: StepContext, split: Split):
        self.settings, self.state, self.roles, self.algorithm, self.context = settings, state, roles, algorithm, context
        self.split = split
        self.planned_steps: int | None = None  # the run's steps (the LR schedule's horizon); None: unknown
        self.layout_choice: Choice | None = None  # an RL run's micro-batch layout (rollout_micro_batches)

    @classmethod
    def for_run(cls, config, state: TrainState, roles: dict[str, TrainedModel], algorithm: StepAlgorithm,
                context: StepContext) -> "Learner":
        """An RL run's learner: its settings and rollout micro-batches."""
        split, choice = rollout_micro_batches(config, roles, algorithm.skip_idle)
        learner = cls(LearnerSettings.of_run(config), state, roles, algorithm, context, split)
        learner.layout_choice = choice
        return learner

    def train_step(self, work: StepWork) -> dict:
        """Train every role for ``ppo_epochs`` optimizer steps on this rank's ``work``; the step's metrics,
        reduced over the trainer group. Collective: every rank calls it with its own share of the same step."""
        algorithm, epochs = self.algorithm, self.settings.epochs
        batches = algorithm.build_batches(work.share, work.kept, work.padding, work.rows)
        metrics = self.set_learning_rates()
        start = time.perf_counter()
        algorithm.objective.delivery_version = None if self.state.trained_since_version else self.state.version
        totals, grad_norms = self.train_epochs(batches, epochs)
        self.state.trained_since_version = True
        totals = self.context.reduce(totals, algorithm.summed_stats, algorithm.max_stats)
        # Per-epoch means (maxima as they are), normalised statistics over the rows trained where rows were left
        # out (algorithm.stats_scale); grad norms are the first epoch's (later epochs see the same data).
        unscaled = set(algorithm.summed_stats) | algorithm.unchanged_stats
        metrics.update({name: value if name in algorithm.max_stats else
                        value / epochs * (1.0 if name in unscaled else algorithm.stats_scale)
                        for name, value in totals.items()})
        if metrics.get("delivery_gap", 0.0) < 0:  # no row of this step was sampled by the current weights
            del metrics["delivery_gap"]
        elif "delivery_gap" in metrics:
            metrics["delivery_version"] = algorithm.objective.delivery_version
        metrics.update({grad_norm_name(name): norms[0] for name, norms in grad_norms.items()})
        metrics.update(optimizer_steps=epochs, train_s=time.perf_counter() - start)
        self.state.step += 1
        return metrics

    def set_learning_rates(self) -> dict[str, float]:
        """Every role's learning rate for this step over the planned steps; nothing changes while they are
        unknown."""
        if self.planned_steps is None:
            return {}
        total = self.settings.optim.schedule_horizon(self.planned_steps)
        rates = {name: role.schedule_learning_rate(self.state.step, total) for name, role in self.roles.items()}
        return {("lr" if name == ACTOR else f"{name}_lr"): rate for name, rate in rates.items()}

    def train_epochs(self, batches: list[dict], epochs: int) -> tuple[dict[str, float], dict[str, list[float]]]:
        """Train every role for ``epochs`` optimizer steps on ``batches``; (this rank's summed statistics, each
        role's gradient norm per epoch)."""
        totals: dict[str, float] = {}
        grad_norms: dict[str, list[float]] = {name: [] for name in self.roles}
        split = [self.split(batch) for batch in batches]  # every epoch the same, in the same order
        for epoch in range(epochs):
            self.algorithm.objective.begin_epoch(epoch)
            stats: list[dict] = []
            for micro_batches in split:
                if not micro_batches:  # no rank has a row of this minibatch to train (Layout.split)
                    continue
                for role in self.roles.values():  # each role's statistics have names of their own
                    stats += role.plugin.forward_backward(micro_batches, role.loss_fn)
            for name, role in self.roles.items():
                grad_norms[name].append(role.plugin.optimizer_step(self.settings.max_grad_norm))
            for name in dict.fromkeys(key for s in stats for key in s):
                values = [float(s[name]) for s in stats if name in s]
                if name in self.algorithm.max_stats:
                    totals[name] = max([totals.get(name, float("-inf"))] + values)
                else:
                    totals[name] = totals.get(name, 0.0) + sum(values)
        return totals, grad_norms


def layout_checks(config, model) -> tuple[str, ...]:
    """What ``TrainedModel.build`` checks every role's model for before its plugin lays it out: the layouts the rule
    may ask about (``layouts_to_check``) for this run and its policy ``model``."""
    parameters = sum(p.numel() for p in model.parameters())
    return layouts_to_check(situation_of(config, attention_of(model), parameters))


def rollout_micro_batches(config, roles: dict[str, TrainedModel], skip_idle: bool = False) -> tuple[Split, Choice]:
    """An RL rank's micro-batches of a minibatch: the layout the rule chooses (coati/layouts/rule.py) for this
    run's plugins and the policy model, where every role's model passed the layout's check; as many micro-batches
    on every rank (collective: the largest count) where the layout's count varies; ``skip_idle``: rows the loss
    gives no gradient left out (``Layout.split``)."""
    actor = roles[ACTOR]
    ragged = all(role.plugin.ragged_micro_batches for role in roles.values())
    situation = situation_of(config, actor.attention, actor.parameters, ragged)
    choice = choose_layout(situation, exact_from([role.layout_checks or {} for role in roles.values()]))
    layout = choice.build()
    return (lambda batch: layout.split(batch, agree_max, skip_idle)), choice
