"""The rollout feed: what one training step trains on, drawn from the buffer (``RolloutFeed.next_step``).

Every rank of the trainer group reads the *same* groups from the buffer (one shared request per draw), so every
decision that depends on the data (what DAPO's filter keeps, when to publish weights, whether to skip a step,
when the data is exhausted) is taken identically on every rank without extra communication; each data-parallel
rank then trains on its own contiguous share of the kept groups. Shares are padded with loss-masked copies to
equal size so that every rank makes the same sequence of collective calls (FSDP2 / ZeRO gather and reduce per
micro-batch).

Drawing (``_pull``, for a step or a whole round): groups come from the buffer and pass the algorithm's
``select_groups`` (e.g. DAPO's accuracy filter). Without dynamic batching one draw of ``dp * tbs`` groups is the
batch, whatever survives. With dynamic batching the group keeps drawing (exactly the deficit each time) until
``dp * tbs`` groups survive, at most ``max_draw_multiple`` times that per step; at that bound, or when the
producers' data is exhausted, it trains on what survived (the step is skipped when nothing did).

When a round feeds several steps (round-level minibatches, round_batches.py) the round is drawn at its first
step and each step takes a random part of its samples, shared by rows; otherwise a step is ``dp * tbs`` whole
groups in draw order.

Weight sync (sync mode): producers generate one round per weight version and wait for the next version, so the
feed publishes (through the ``publish`` it is handed) whenever the round is used up, also in the middle of a step
that needs more groups than the round holds: a step can never wait for groups whose version it has not
published, so filtering cannot deadlock the two sides. Before the first draw of a version's round, this rank's
own generators (learner-side, colocated: own_rounds.py) put their groups into the buffer.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import ray

from coati.rollout.group import RolloutGroup
from coati.trainer.round_batches import RoundPool, parts_of_round, round_part
from coati.trainer.step_algorithm import StepAlgorithm
from coati.trainer.step_data import StepWork, rollout_metrics, share_bounds
from coati.trainer.train_state import TrainState


def dp_share(kept: list, dp: int, dp_rank: int) -> tuple[list, int]:
    """Rank ``dp_rank``'s contiguous share of ``kept``, padded with copies of a kept group to the largest share's
    size (every rank must make the same collective calls); (share, padding)."""
    start, end = share_bounds(len(kept), dp, dp_rank)
    share = kept[start:end]
    padding = -(-len(kept) // dp) - len(share)
    return share + [dataclasses.replace(kept[0]) for _ in range(padding)], padding


class RolloutFeed:
    def __init__(self, config, state: TrainState, buffer, algorithm: StepAlgorithm, layout: tuple[int, int, int],
                 generators: list, publish: Callable[[], None]):
        """``layout``: (world size, dp size, dp rank); ``generators``: this rank's own round makers (own_rounds.py);
        ``publish``: the collective publish of the current weights, due when a round is used up."""
        self.config, self.state, self.buffer, self.algorithm = config, state, buffer, algorithm
        self.world, self.dp, self.dp_rank = layout
        self.generators, self.publish = generators, publish
        self.total_groups: int | None = None  # groups the run draws in all (None: unbounded)
        self.round_steps = config.steps_per_sync if config.batch.round_minibatches else 1
        self._draws = 0  # draws in the current step
        self._staleness: list[int] = []  # per kept group of the current draw: versions behind the trainer

    def next_step(self) -> StepWork | None:
        """This rank's part of the next step; None once the data is exhausted."""
        return self._round_part() if self.round_steps > 1 else self._whole_groups()

    def _draw(self, count: int) -> list[RolloutGroup]:
        # One request per draw, read by every rank of the group (the first caller pops, the rest get a copy);
        # ids are unique per draw, so skipped steps do not reuse them.
        state = self.state
        request = f"draw{state.draw_serial}"
        state.draw_serial += 1
        self._draws += 1
        groups = ray.get(self.buffer.get.remote(count, request, self.world))
        state.drawn_total += len(groups)
        state.drawn_since_sync += len(groups)
        return groups

    def _pull(self, target: int) -> tuple[list[RolloutGroup] | None, list[RolloutGroup], dict]:
        """(``target`` groups to train on, all groups drawn, draw statistics); (None, [], {}) when data is exhausted."""
        groups_config, state, schedule = self.config.algo.groups, self.state, self.config.schedule
        dynamic = groups_config.dynamic_batching
        max_draw = target * groups_config.max_draw_multiple if dynamic else target
        kept, drawn, counters, self._draws, self._staleness = [], [], {}, 0, []
        while len(kept) < target and len(drawn) < max_draw:
            remaining = None if self.total_groups is None else self.total_groups - state.drawn_total
            if remaining == 0:
                break
            if schedule.publish_due(state.drawn_since_sync):  # the round is used up: producers need new weights
                self.publish()
            want = (target - len(kept)) if dynamic else (target - len(drawn))
            count = min(want, max_draw - len(drawn), schedule.draw_limit(state.drawn_since_sync),
                        remaining if remaining is not None else want)
            for generator in self.generators:  # the version's round starts: add this rank's groups
                generator.fill(self.buffer, schedule.own_round(state.version), state.version)
            groups = self._draw(count)
            drawn.extend(groups)
            survivors, stats = self.algorithm.select_groups(groups)
            kept.extend(survivors)
            self._staleness += [schedule.staleness(state.version, g.policy_version) for g in survivors]
            for name, value in stats.items():
                counters[name] = counters.get(name, 0) + value
        if not drawn:
            return None, [], {}
        info = {"groups_drawn": len(drawn), "groups_kept": len(kept), "draws": self._draws, **counters,
                "draw_limit_hit": int(dynamic and len(kept) < target and len(drawn) >= max_draw),
                "data_exhausted": int(len(kept) < target and self.total_groups is not None
                                      and state.drawn_total >= self.total_groups)}
        return kept, drawn, info

    def _whole_groups(self) -> StepWork | None:
        """One step's whole groups in draw order (``--no-round-minibatches``, or a round of one step)."""
        groups, drawn, info = self._pull(self.config.batch.train_batch_size * self.dp)
        if groups is None:
            return None
        share, padding = dp_share(groups, self.dp, self.dp_rank) if groups else ([], 0)
        info = {**info, **rollout_metrics(drawn, self.state.version)}
        return StepWork(share=share, kept=groups, padding=padding, info=info, staleness=self._staleness,
                        prompts=len(groups), samples=sum(len(g.responses) for g in groups), drawn=drawn, groups=groups)

    def _round_part(self) -> StepWork | None:
        """The next part of the current round, drawing the round first when the last one is used up."""
        state = self.state
        first = state.round is None
        if first:
            target = self.config.batch.train_batch_size * self.dp
            kept, drawn, info = self._pull(target * self.round_steps)
            if kept is None:
                return None
            if not kept:
                return StepWork(share=[], kept=[], padding=0, info={**info, **rollout_metrics(drawn, state.version)},
                                staleness=[], prompts=0, samples=0, drawn=drawn)
            parts = parts_of_round(len(kept), target, self.round_steps)
            state.round = RoundPool.build(state.round_serial, self.config.run.seed, kept, drawn, info,
                                          self._staleness, parts, state.version)
            state.round.tensors = self.algorithm.round_tensors(kept)
            state.round_serial += 1
        work = round_part(state.round, self.dp, self.dp_rank)
        if first:  # the rollout log records the whole round at its first step, if any of its steps is due
            work.drawn, work.groups, work.log_steps = drawn, kept, state.round.parts
        if state.round.done:
            state.round = None
        return work
