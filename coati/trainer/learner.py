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

from coati.algorithm.batch import (micro_batch_count, split_micro_batches, token_budget_micro_batches,
                                   with_logits_window)
from coati.config.batch_defaults import micro_batch_tokens, packed_row_tokens
from coati.config.optim import OptimConfig
from coati.plugins.dist import agree_max
from coati.trainer.roles import ACTOR, TrainedModel, grad_norm_name
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
        self.micro_batching: MicroBatching | None = None  # an RL run's (rollout_micro_batches)

    @classmethod
    def for_run(cls, config, state: TrainState, roles: dict[str, TrainedModel], algorithm: StepAlgorithm,
                context: StepContext) -> "Learner":
        """An RL run's learner: its settings and rollout micro-batches."""
        split, micro_batching = rollout_micro_batches(config, roles)
        learner = cls(LearnerSettings.of_run(config), state, roles, algorithm, context, split)
        learner.micro_batching = micro_batching
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
        # Per-epoch means (maxima as they are); grad norms are the first epoch's (later epochs see the same data).
        metrics.update({name: value if name in algorithm.max_stats else value / epochs for name, value in totals.items()})
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


@dataclass(frozen=True)
class MicroBatching:
    """How an RL rank cuts a minibatch into micro-batches: ``rows`` of ``size`` each (pipeline schedules), or by a
    token budget of ``size`` tokens, ``padded`` (rows x their longest), ``packed`` (real tokens, one row each) or
    ``shared`` (whole groups, each prompt run once: both passes' padded tokens)."""
    kind: str
    size: int
    why: str = ""

    def line(self) -> str:
        """The trainer's one line on it, for the start of a run."""
        what = {"rows": f"{self.size} rows each (-tmbs per pipeline stage)",
                "padded": f"at most {self.size} padded tokens each, rows longest first",
                "packed": f"at most {self.size} tokens each, the samples packed into one row without padding",
                "shared": f"at most {self.size} tokens each, whole groups, each group's prompt run once for its "
                          "samples (--shared-prompts)"}[self.kind]
        return f"trainer micro-batches: {what}" + (f"; {self.why}" if self.why else "")


def choose_micro_batching(packing: str, ragged: bool, packs: bool, attention: str | None, budget: int,
                          rows: int, model_note: str = "", sharing: str = "off", shares: bool = False,
                          sharing_note: str = "") -> MicroBatching:
    """The micro-batching of an RL run (pure): ``packing`` is --packing; ``ragged``, whether every role's plugin
    takes micro-batches of any shape; ``packs``, whether every role's plugin and model pack (``TrainedModel``);
    ``model_note``, why not; ``sharing``, ``shares`` and ``sharing_note`` the same of --shared-prompts, which goes
    first (it saves the most: a group's prompt computed once, not G times). --packing/--shared-prompts on where
    it cannot raises ValueError. ``auto`` packs under a
    variable-length attention kernel only: under dense attention (sdpa/eager) a packed step was slower than the
    padded one on a CPU (docs/results.md: its attention and its smaller matmuls cost more than the padding saved)."""
    if not ragged:
        return MicroBatching("rows", rows)
    if sharing == "on" and not shares:
        raise ValueError(f"--shared-prompts on: {sharing_note or 'this run cannot share prompts'}; use "
                         "--shared-prompts auto or off")
    if sharing != "off" and shares:
        return MicroBatching("shared", budget)
    if packing == "off":
        return MicroBatching("padded", budget)
    row = packed_row_tokens(attention, budget)
    if packing == "auto" and row < budget:  # decided before any check of the model (packing_checked)
        return MicroBatching("padded", budget, f"not packed: {attention} attention spans a whole packed row, which "
                             "made a step slower than padded rows (--packing on packs anyway)")
    if packing == "on" and not packs:
        raise ValueError(f"--packing on: {model_note or 'this run cannot pack samples'}; use --packing auto or off")
    if not packs:
        return MicroBatching("padded", budget, model_note)
    why = "" if row == budget else f"{attention} attention spans a whole packed row: at most {row} tokens a row"
    return MicroBatching("packed", row, why)


def packing_checked(config, attention: str | None) -> bool:
    """Whether a model of ``attention`` is checked for packing before training (``packs_like_padding``, a forward
    on two samples): only where ``choose_micro_batching`` may pack, --packing on or auto under a kernel that spans
    a whole budget's row."""
    packing, budget = config.batch.packing, micro_batch_tokens(config)
    return packing == "on" or (packing == "auto" and packed_row_tokens(attention, budget) == budget)


def rollout_micro_batches(config, roles: dict[str, TrainedModel]) -> tuple[Split, MicroBatching]:
    """An RL rank's micro-batches of a minibatch (``choose_micro_batching``). Where every role's plugin takes
    micro-batches of any shape: by token budget (``micro_batch_tokens``), longest rows first, each cut to its own
    longest row (or packed) and naming the logits its loss reads; as many on every rank (collective: the largest
    count). Else ``tmbs`` rows each (``tmbs // pp`` under pipeline stages, as ColossalChat's microbatch_size)."""
    rows = max(1, config.batch.train_microbatch_size // config.parallel.pipeline_parallel_size)
    ragged = all(role.plugin.ragged_micro_batches for role in roles.values())
    packs = all(role.packs_rows for role in roles.values())
    note = "" if packs else (
        "the model's attention crosses packed samples (a two-sample forward differed from the padded one)"
        if config.parallel.plugin_spec.packs_rows else f"the {config.parallel.plugin_name} plugin runs a forward of its own")
    shares = all(role.shares_prompts for role in roles.values())
    sharing_note = "" if shares else (
        "the model's logits differed when its prompts ran once (a KV-cache forward checked before training)"
        if config.parallel.plugin_spec.shares_prompts and not config.algo.optim.gradient_checkpointing
        else "it needs the single-process plugin without --gradient-checkpointing")
    attention = roles[ACTOR].attention
    choice = choose_micro_batching(config.batch.packing, ragged, packs, attention, micro_batch_tokens(config), rows,
                                   note, config.batch.shared_prompts, shares, sharing_note)
    if choice.kind == "rows":
        return (lambda batch: split_micro_batches(batch, rows)), choice
    packed, shared = choice.kind == "packed", choice.kind == "shared"

    def by_tokens(batch: dict) -> list[dict]:
        count = agree_max(micro_batch_count(batch, choice.size, packed, shared))
        return [with_logits_window(micro)
                for micro in token_budget_micro_batches(batch, choice.size, count, packed, shared)]

    return by_tokens, choice
