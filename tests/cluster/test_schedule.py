"""The rollout protocol (coati.cluster.schedule): hand-checked answers, then a property test that drives
producers and a trainer at random relative speeds through the schedule object and the real buffer."""

import asyncio
import random

import pytest

from coati.cluster.buffer import RolloutBuffer
from coati.cluster.schedule import RolloutSchedule, node_cores, node_thread_budgets, thread_budgets


def test_sync_mode_answers():
    schedule = RolloutSchedule(groups_per_round=8)
    assert [schedule.min_version(r) for r in range(4)] == [0, 1, 2, 3]  # round r needs exactly version r
    assert not schedule.is_async and schedule.rounds_in_flight == 1 and schedule.buffer_capacity == 8
    assert not schedule.publish_due(7) and schedule.publish_due(8)
    assert schedule.draw_limit(3) == 5


def test_staleness_two_answers():
    schedule = RolloutSchedule(groups_per_round=8, max_staleness=2)
    assert [schedule.min_version(r) for r in range(5)] == [0, 0, 0, 1, 2]
    assert schedule.may_start(3, 1) and not schedule.may_start(4, 1)
    assert schedule.rounds_in_flight == 3 and schedule.buffer_capacity == 24
    assert schedule.staleness(trainer_version=5, group_version=3) == 2


def test_bad_schedules_fail():
    with pytest.raises(ValueError, match="max staleness"):
        RolloutSchedule(8, -1)
    with pytest.raises(ValueError, match="at least one group"):
        RolloutSchedule(0)


def test_thread_budgets_never_oversubscribe_in_async_mode():
    assert thread_budgets(2, 1, 1, concurrent=False) == (2, 2)  # sync: they take turns
    assert thread_budgets(16, 2, 4, concurrent=False) == (16, 4)
    assert thread_budgets(2, 1, 1, concurrent=True) == (1, 1)
    assert thread_budgets(16, 2, 2, concurrent=True) == (4, 4)
    assert thread_budgets(2, 2, 2, concurrent=True) == (1, 1)  # more actors than cores: one thread each


@pytest.mark.parametrize("cores,producers,trainers", [(2, 1, 1), (16, 2, 4), (16, 2, 2), (2, 2, 2), (7, 3, 2)])
@pytest.mark.parametrize("concurrent", [False, True])
def test_node_thread_budgets_on_one_node_are_todays_budgets(cores, producers, trainers, concurrent):
    producer_threads, trainer_threads = node_thread_budgets({"n": cores}, ["n"] * producers, ["n"] * trainers,
                                                            concurrent)
    want = thread_budgets(cores, producers, trainers, concurrent)
    assert producer_threads == [want[0]] * producers and trainer_threads == [want[1]] * trainers


def test_node_thread_budgets_split_each_nodes_own_cores_among_the_actors_placed_there():
    cores = {"head": 8, "gpu1": 32, "gpu2": 4}
    # producer 0 beside the driver, producer 1 with trainer ranks 0-1, trainer ranks 2-3 alone on a small node
    placement = (["head", "gpu1"], ["gpu1", "gpu1", "gpu2", "gpu2"])
    assert node_thread_budgets(cores, *placement, concurrent=False) == ([8, 32], [16, 16, 2, 2])
    assert node_thread_budgets(cores, *placement, concurrent=True) == ([8, 10], [10, 10, 2, 2])
    assert node_thread_budgets({"a": 2}, ["a"], [], concurrent=False) == ([2], [])  # a node with no trainer


def test_node_cores_are_rays_cpus_but_never_more_than_the_driver_machine_has():
    # a local cluster declares max(actors, cores) CPUs: the driver's 2 cores count, not Ray's 4 slots
    assert node_cores({"local": 4.0}, "local", 2) == {"local": 2}
    # `ray start --num-cpus 6` on the driver's 16-core node, a worker node with 32 detected CPUs
    assert node_cores({"head": 6.0, "worker": 32.0}, "head", 16) == {"head": 6, "worker": 32}
    assert node_cores({"head": 8.0}, "head", 16) == {"head": 8}


def simulate(schedule, producers, rounds, chunks, rng):
    """Producers generate rounds chunk by chunk (admitted by ``min_version``, picking up the newest version
    between chunks) and put whole rounds into a real RolloutBuffer laid out by the schedule; the trainer draws
    random-sized batches, publishing when due. Actors act in random order, each at its own random speed.
    Returns (max staleness, max buffer size, groups drawn)."""
    return asyncio.run(_simulate(schedule, producers, rounds, chunks, rng))


async def _simulate(schedule, producers, rounds, chunks, rng):
    per_round = schedule.groups_per_round
    total = rounds * per_round
    chunk_size = per_round // producers // chunks
    buffer = RolloutBuffer(schedule.buffer_capacity, schedule.slots())
    version, drawn, since_publish = 0, [], 0
    state = [{"round": 0, "chunk": 0, "groups": []} for _ in range(producers)]
    speeds = [rng.uniform(0.05, 1.0) for _ in range(producers + 1)]
    max_stale = max_buffer = 0
    for _ in range(100_000):
        if len(drawn) == total:
            return max_stale, max_buffer, drawn
        actor = rng.choices(range(producers + 1), weights=speeds)[0]
        if actor < producers:
            p = state[actor]
            if p["round"] == rounds:
                continue
            if p["chunk"] == 0 and not schedule.may_start(p["round"], version):
                continue  # admission control: wait for weights
            p["groups"] += [(actor, p["round"], p["chunk"], i, version) for i in range(chunk_size)]
            p["chunk"] += 1
            if p["chunk"] == chunks:
                assert await buffer.size() + len(p["groups"]) <= schedule.buffer_capacity, "an admitted put would block"
                await buffer.put(p["groups"], actor, p["round"])
                max_buffer = max(max_buffer, await buffer.size())
                p.update(round=p["round"] + 1, chunk=0, groups=[])
        else:
            if schedule.publish_due(since_publish):
                version, since_publish = version + 1, 0
            want = min(rng.randint(1, per_round), schedule.draw_limit(since_publish), total - len(drawn))
            if not buffer._drawable(want):
                continue  # the trainer waits for groups
            batch = await buffer.get(want)
            since_publish += want
            drawn += batch
            max_stale = max([max_stale] + [schedule.staleness(version, g[4]) for g in batch])
    raise AssertionError("deadlock: nobody could make progress")


@pytest.mark.parametrize("staleness", [0, 1, 2, 3])
def test_staleness_never_exceeds_the_bound_under_random_speeds(staleness):
    for seed in range(40):
        rng = random.Random(seed * 10 + staleness)
        producers, chunks = rng.randint(1, 3), rng.randint(1, 3)
        schedule = RolloutSchedule.for_run(producers, chunks * rng.randint(1, 3), max_staleness=staleness)
        rounds = rng.randint(staleness + 1, 8)
        max_stale, max_buffer, drawn = simulate(schedule, producers, rounds, chunks, rng)
        assert max_stale <= staleness
        assert max_buffer <= schedule.buffer_capacity
        assert len(set(drawn)) == len(drawn) == rounds * schedule.groups_per_round  # each group once


def test_the_bound_is_reached_when_producers_are_fast():
    """Not a loose bound: a fast producer next to a slow trainer does train on S-versions-old groups."""
    schedule = RolloutSchedule.for_run(1, 4, max_staleness=2)
    seen = set()
    for seed in range(20):
        rng = random.Random(seed)
        max_stale, max_buffer, _ = simulate(schedule, 1, 6, 2, rng)
        seen.add(max_stale)
        if max_stale == 2:
            assert max_buffer <= 12
    assert 2 in seen


def test_round_layout_puts_the_learner_first_then_producers_by_rank():
    schedule = RolloutSchedule.for_run(num_producers=2, groups_per_producer=8, learner_groups=4, max_staleness=1)
    assert schedule.groups_per_round == 20 and schedule.buffer_capacity == 40
    assert schedule.slots() == {"learner": (0, 4), 0: (4, 8), 1: (12, 8)}
    assert RolloutSchedule.for_run(1, 8).slots() == {0: (0, 8)}
    with pytest.raises(ValueError, match="do not add up"):
        RolloutSchedule(9, 0, ((0, 8),))


def test_generator_streams_and_own_rounds():
    schedule = RolloutSchedule.for_run(num_producers=2, groups_per_producer=8, learner_groups=4)
    assert [schedule.source(k) for k in range(3)] == [0, 1, "learner"]  # the learner is the stream after them all
    assert [schedule.round_size(schedule.source(k)) for k in range(3)] == [8, 8, 4]
    with pytest.raises(ValueError, match="no generator stream 2"):
        RolloutSchedule.for_run(2, 8).source(2)  # no learner without --learner-chunk-size
    assert [schedule.own_round(v) for v in range(3)] == [0, 1, 2]
    # at a step boundary right after publishing version 3, round 3 is not made yet; after a draw it is
    assert schedule.own_rounds_filled(3, 0) == 2 and schedule.own_rounds_filled(3, 5) == 3
    with pytest.raises(ValueError, match="synchronous"):
        RolloutSchedule.for_run(2, 8, 4, max_staleness=1).own_round(1)
