"""The one owner of the rollout protocol between producers and the trainer group (pure, no Ray).

A *round* is one ``-ibs`` batch of prompts from every producer plus the learner's ``--learner-chunk-size``
prompts: ``groups_per_round`` groups. Weight *version* v is the v-th set of weights the trainer group has
published; it publishes each time it has drawn a whole round's worth of groups, so after version v is
published exactly v rounds' worth of groups have been drawn.

Staleness bound ``S`` (``--max-staleness``, ColossalChat's ``-nb``): a producer may start round r once
version >= r - S is published (admission control: it waits, nothing is ever discarded). Rounds r - S .. r
can then be generated or buffered while rounds < r - S are drawn, so

- at most S + 1 rounds are in flight or buffered, and the buffer needs room for S + 1 rounds;
- a group of round r generated with version g >= r - S is drawn while the trainer holds version r (it
  draws round r only after rounds 0 .. r - 1, i.e. after publishing version r); its staleness r - g <= S.
  Producers that pick up a newer version between generate calls only lower it.

S = 0 is the synchronous protocol: round r is generated with exactly version r, trained on at version r.

Draw order: a round's groups are drawn in a fixed order of *slots*, whatever the order they arrive in: the
learner's groups first (it makes them in the trainer's own process right before the round's first draw), then
each producer's in rank order (``sources``, ``slots``). Which groups a step trains on then never depends on
which actor finished first, so a sync run is reproducible and resumes exactly.

Generator streams: every generator is one stream index (its prompt shard and seeds): producers (or, with
``--colocate``, trainer ranks) 0 .. P-1 are their ranks, and the learner is stream P, after all of them
(``source``). Generators inside the trainer group (the learner, colocated ranks) make round v right after
publishing version v (``own_round``), which is why they need the synchronous protocol.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

LEARNER = "learner"  # the source name of learner-side generation (--learner-chunk-size)


@dataclass(frozen=True)
class RolloutSchedule:
    groups_per_round: int
    max_staleness: int = 0
    # (source, groups it puts per round) in draw order; empty: one anonymous source of the whole round
    sources: tuple = ()

    def __post_init__(self):
        if self.groups_per_round < 1:
            raise ValueError(f"a round must hold at least one group, got {self.groups_per_round}")
        if self.max_staleness < 0:
            raise ValueError(f"max staleness must be >= 0, got {self.max_staleness}")
        if self.sources and sum(count for _, count in self.sources) != self.groups_per_round:
            raise ValueError(f"the sources' groups {list(self.sources)} do not add up to a round of "
                             f"{self.groups_per_round}")

    @classmethod
    def for_run(cls, num_producers: int, groups_per_producer: int, learner_groups: int = 0,
                max_staleness: int = 0) -> "RolloutSchedule":
        sources = ((LEARNER, learner_groups),) if learner_groups else ()
        sources += tuple((rank, groups_per_producer) for rank in range(num_producers))
        return cls(num_producers * groups_per_producer + learner_groups, max_staleness, sources)

    def slots(self) -> dict:
        """source -> (first slot, count) of its groups within a round, in the fixed draw order."""
        layout, offset = {}, 0
        for source, count in self.sources:
            layout[source] = (offset, count)
            offset += count
        return layout

    def source(self, stream: int):
        """The buffer source of generator ``stream``: a producer's (or colocated rank's) rank, or ``LEARNER`` for
        the stream after them all."""
        producers = [source for source, _ in self.sources if source != LEARNER]
        if 0 <= stream < len(producers):
            return producers[stream]
        if stream == len(producers) and LEARNER in self.slots():
            return LEARNER
        raise ValueError(f"no generator stream {stream} in a round of {[s for s, _ in self.sources]}")

    def round_size(self, source) -> int:
        """Groups ``source`` puts into each round (``-ibs`` for a producer, ``--learner-chunk-size`` the learner)."""
        return self.slots()[source][1]

    def own_round(self, version: int) -> int:
        """The round a generator inside the trainer group makes right after publishing weights ``version`` (and
        once at version 0, before the first draw): round v, since in the synchronous protocol round r is generated
        with exactly version r."""
        if self.is_async:
            raise ValueError("generators inside the trainer group need the synchronous protocol (max staleness 0)")
        return version

    def own_rounds_filled(self, version: int, drawn_since_publish: int) -> int:
        """The newest round a trainer-side generator has made at a step boundary: it fills ``own_round(version)``
        right before the first draw at that version, so only once something was drawn since the publish."""
        return self.own_round(version) - (drawn_since_publish == 0)

    @property
    def is_async(self) -> bool:
        return self.max_staleness > 0

    def min_version(self, round_index: int) -> int:
        """The oldest published weight version a producer may start ``round_index`` with."""
        return max(0, round_index - self.max_staleness)

    def may_start(self, round_index: int, published_version: int) -> bool:
        return published_version >= self.min_version(round_index)

    def publish_due(self, drawn_since_publish: int) -> bool:
        """Whether the trainer group must publish before drawing more: it has drawn a whole round since the
        last publish (also in the middle of a step, so that a step never waits for a round whose weights it
        has not published: filtering cannot deadlock the two sides)."""
        return drawn_since_publish >= self.groups_per_round

    def draw_limit(self, drawn_since_publish: int) -> int:
        """How many groups the trainer may draw before the next publish is due."""
        return self.groups_per_round - drawn_since_publish

    @property
    def rounds_in_flight(self) -> int:
        """Rounds that may be generating or buffered at once."""
        return self.max_staleness + 1

    @property
    def buffer_capacity(self) -> int:
        """Groups the rollout buffer must hold so that no admitted producer ever blocks on a put."""
        return self.rounds_in_flight * self.groups_per_round

    def staleness(self, trainer_version: int, group_version: int) -> int:
        """Publishes between the weights that generated a group and the trainer's at the time it is drawn."""
        return trainer_version - group_version


def thread_budgets(cores: int, num_producers: int, num_trainers: int, concurrent: bool) -> tuple[int, int]:
    """torch threads for (each producer, each trainer rank).

    Sync mode: producers and trainers take turns, so each side may use every core (the trainer ranks of one
    group run together and share them). Async mode: they all run at once; torch's OpenMP threads spin on
    descheduled cores (measured here: 2 threads next to one other busy process ran ~20x slower), so the
    cores are split evenly and nobody gets more than its share (at least 1 thread).
    """
    cores = max(1, cores)
    if not concurrent:
        return cores, max(1, cores // max(1, num_trainers))
    share = max(1, cores // max(1, num_producers + num_trainers))
    return share, share


def node_thread_budgets(node_cores: Mapping[str, int], producer_nodes: Sequence[str], trainer_nodes: Sequence[str],
                        concurrent: bool) -> tuple[list[int], list[int]]:
    """torch threads for each producer and each trainer rank (two lists, by rank) on a cluster whose nodes
    differ: ``thread_budgets`` with the cores of the node each actor was placed on and only the actors placed
    there, since actors on other nodes take none of its cores. ``producer_nodes[i]`` / ``trainer_nodes[r]``:
    the node of producer i / trainer rank r; ``node_cores``: each node's cores. On one node this is exactly
    ``thread_budgets`` of the whole run."""
    def budgets(node: str) -> tuple[int, int]:
        return thread_budgets(node_cores[node], producer_nodes.count(node), trainer_nodes.count(node), concurrent)

    return [budgets(node)[0] for node in producer_nodes], [budgets(node)[1] for node in trainer_nodes]


def node_cores(node_cpus: Mapping[str, float], driver_node: str, driver_cores: int) -> dict[str, int]:
    """The cores each node's thread budgets share: the CPUs Ray counts on it (what ``ray start`` detected there,
    or its ``--num-cpus``), and on the driver's own node never more than the machine has, because a local
    cluster declares at least one CPU per actor so that every actor gets a slot even on fewer cores."""
    cores = {node: max(1, int(cpus)) for node, cpus in node_cpus.items()}
    cores[driver_node] = max(1, min(cores.get(driver_node, driver_cores), driver_cores))
    return cores


def round_seed(seed: int, rank: int, round_index: int) -> int:
    """Sampling seed of producer ``rank``'s round ``round_index``: independent streams, no arithmetic collisions."""
    return int(np.random.SeedSequence([seed, rank, round_index]).generate_state(1)[0])
