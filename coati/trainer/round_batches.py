"""Round-level minibatches: the optimizer steps of one round each train on a random part of the round's samples.

A round (``config.groups_per_sync`` groups, one weight version) feeds ``config.steps_per_sync`` steps. With
``--round-minibatches`` (the default) the trainer group draws the round's groups once, at the round's first
step, and the algorithm computes what needs whole groups (shaped rewards, advantages, sample masks) over them.
The round's samples are then permuted by ``round_permutation(seed, round)`` and cut into the round's steps;
each data-parallel rank takes its contiguous share of a part's *samples* (every rank holds the same
permutation). A step over a random part of the round sees about twice as many prompts as one over whole
groups, with fewer completions each: a less noisy gradient for the same number of samples (TRL's GRPOTrainer
shuffles a generation round the same way).

The round index is the ``TrainState.round_serial``: the number of rounds drawn before this one. Without a group
filter it equals the weight version the round is trained at. With ``--ppo-epochs > 1`` every epoch of a step
trains on the step's part: an epoch is one optimizer step over the whole part (minibatches accumulate), so a
new order within the part would change nothing, and a part drawn afresh per epoch would lose the proximal
logprobs (objective.py) that anchor the step.

``--no-round-minibatches``, or a round of one step, trains whole groups in draw order, as ``RolloutFeed._pull``
delivers them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from coati.rollout.group import RolloutGroup
from coati.trainer.step_data import StepWork, rollout_metrics, share_bounds

# Draw statistics that describe the whole round (coati.trainer.rollout_feed.RolloutFeed._pull), reported at each of its steps.
ROUND_FLAGS = ("draw_limit_hit", "data_exhausted")


def round_permutation(seed: int, round_index: int, count: int) -> list[int]:
    """The order of a round's ``count`` samples: a pure function of (run seed, round index)."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, round_index]))
    return rng.permutation(count).tolist()


def parts_of_round(groups: int, groups_per_step: int, steps_per_round: int) -> int:
    """Steps a round of ``groups`` kept groups feeds: one per ``groups_per_step`` begun, at most the round's
    steps (a round short of groups after a filter, or at the end of the data, feeds fewer)."""
    return max(1, min(steps_per_round, -(-groups // groups_per_step)))


def sample_view(group: RolloutGroup, index: int) -> RolloutGroup:
    """Response ``index`` of ``group`` as a group of one (what ``collate`` and the rollout metrics read); its
    seconds are its share of the group's, so that sums over a group's views equal the group's."""
    def one(values: list) -> list:
        return values[index : index + 1]

    size = len(group.responses)
    return dataclasses.replace(
        group, responses=one(group.responses), logprobs=one(group.logprobs), rewards=one(group.rewards),
        correct=one(group.correct), format_ok=one(group.format_ok), finish_reasons=one(group.finish_reasons),
        texts=one(group.texts), scores=one(group.scores), reward_parts=one(group.reward_parts),
        reasons=one(group.reasons), loss_masks=one(group.loss_masks), turns=one(group.turns),
        generate_s=group.generate_s / size, score_s=group.score_s / size)


@dataclass
class RoundRows:
    """What ``StepAlgorithm.build_batches`` reads besides the sample views: the round's per-sample tensors
    (computed over whole groups by ``round_tensors``) and the round's sample indices behind ``share`` and
    ``kept``."""
    tensors: dict[str, torch.Tensor]
    share: list[int]
    kept: list[int]


@dataclass
class RoundPool:
    """One round drawn at once and the steps it still feeds (plain values: a checkpoint keeps it)."""
    serial: int  # the round index of the permutation
    kept: list[RolloutGroup]
    parts: int
    order: list[int]  # round_permutation of the kept groups' samples
    staleness: list[int]  # per kept group
    info: dict  # draw counters of the whole round
    part_metrics: list[dict]  # per part: rollout metrics of its share of the drawn groups, groups drawn and kept
    next_part: int = 0
    tensors: dict = field(default_factory=dict)  # the algorithm's round_tensors(kept); rebuilt, never saved

    @classmethod
    def build(cls, serial: int, seed: int, kept: list[RolloutGroup], drawn: list[RolloutGroup], info: dict,
              staleness: list[int], parts: int, version: int) -> "RoundPool":
        order = round_permutation(seed, serial, sum(len(g.responses) for g in kept))
        part_metrics = []
        for index in range(parts):
            start, end = share_bounds(len(drawn), parts, index)
            kept_start, kept_end = share_bounds(len(kept), parts, index)
            part_metrics.append({**rollout_metrics(drawn[start:end], version), "groups_drawn": end - start,
                                 "groups_kept": kept_end - kept_start})
        return cls(serial, kept, parts, order, staleness, info, part_metrics)

    @property
    def done(self) -> bool:
        return self.next_part >= self.parts

    def take(self) -> tuple[int, list[int]]:
        """(index, the round's sample indices) of the next part."""
        index = self.next_part
        start, end = share_bounds(len(self.order), self.parts, index)
        self.next_part += 1
        return index, self.order[start:end]

    def owners(self, rows: list[int]) -> list[int]:
        """The index of the kept group each of the round's samples ``rows`` belongs to."""
        starts = np.cumsum([0] + [len(g.responses) for g in self.kept])
        return (np.searchsorted(starts, rows, side="right") - 1).tolist()

    def views(self, rows: list[int]) -> list[RolloutGroup]:
        starts = np.cumsum([0] + [len(g.responses) for g in self.kept]).tolist()
        return [sample_view(self.kept[g], r - starts[g]) for r, g in zip(rows, self.owners(rows))]

    def state(self) -> dict:
        return {name: getattr(self, name) for name in ("serial", "parts", "order", "staleness", "info",
                                                        "part_metrics", "next_part")} | \
            {"kept": [asdict(g) for g in self.kept]}

    @classmethod
    def from_state(cls, state: dict) -> "RoundPool":
        values = dict(state)
        values["kept"] = [RolloutGroup.from_dict(row) for row in values["kept"]]
        return cls(**values)


def round_part(pool: RoundPool, dp: int, dp_rank: int) -> StepWork:
    """The next step of ``pool`` for data-parallel rank ``dp_rank``: its contiguous share of the part's samples,
    padded with masked copies of the part's first sample to the largest share's size (every rank makes the same
    collective calls). Draw counters are the round's at its first step and 0 at the others (their sums over
    the run stay right); ``ROUND_FLAGS`` hold at every step of the round."""
    index, rows = pool.take()
    start, end = share_bounds(len(rows), dp, dp_rank)
    padding = -(-len(rows) // dp) - (end - start)
    share_rows = rows[start:end] + rows[:1] * padding
    groups = sorted(set(pool.owners(rows)))
    info = {name: value if index == 0 or name in ROUND_FLAGS else 0 for name, value in pool.info.items()}
    info |= pool.part_metrics[index]
    return StepWork(share=pool.views(share_rows), kept=pool.views(rows), padding=padding, info=info,
                    staleness=[pool.staleness[g] for g in groups], prompts=len(groups), samples=len(rows),
                    rows=RoundRows(pool.tensors, share_rows, rows))
