import asyncio

import pytest

from coati.cluster.buffer import RolloutBuffer


def test_fifo_blocking_get_and_backpressure():
    async def scenario():
        buffer = RolloutBuffer(capacity=4)
        getter = asyncio.create_task(buffer.get(3))
        await buffer.put([1, 2])
        await asyncio.sleep(0.01)
        assert not getter.done()  # waits for a full request
        await buffer.put([3, 4])
        assert await getter == [1, 2, 3]
        await buffer.put([5, 6, 7])
        blocked = asyncio.create_task(buffer.put([8]))  # 4 + 1 > capacity
        await asyncio.sleep(0.01)
        assert not blocked.done()
        assert await buffer.get(2) == [4, 5]
        await asyncio.wait_for(blocked, 1)
        assert await buffer.size() == 3

    asyncio.run(scenario())


def test_shared_request_serves_all_readers_the_same_groups():
    async def scenario():
        buffer = RolloutBuffer(capacity=8)
        await buffer.put(list(range(6)))
        first = await buffer.get(2, request_id="step0-dp0", readers=2)
        second = await buffer.get(2, request_id="step0-dp0", readers=2)
        other = await buffer.get(2, request_id="step0-dp1")
        assert first == second == [0, 1] and other == [2, 3]
        assert await buffer.get(2, request_id="step0-dp0", readers=2) == [4, 5]  # the entry was released

    asyncio.run(scenario())


def test_shared_readers_that_wait_before_the_groups_arrive_get_one_pop():
    """Both ranks ask for the same request before the producer has put anything: the groups are popped once
    (a second pop would take the next round's groups and leave the trainer group waiting forever)."""
    async def scenario():
        buffer = RolloutBuffer(capacity=8)
        readers = [asyncio.create_task(buffer.get(3, request_id="draw0", readers=2)) for _ in range(2)]
        await asyncio.sleep(0.01)
        await buffer.put([1, 2, 3, 4])
        assert await asyncio.wait_for(asyncio.gather(*readers), 1) == [[1, 2, 3], [1, 2, 3]]
        assert await buffer.size() == 1 and buffer.total_got == 3

    asyncio.run(scenario())


def test_oversized_requests_fail_fast():
    async def scenario():
        buffer = RolloutBuffer(capacity=2)
        with pytest.raises(ValueError):
            await buffer.put([1, 2, 3])
        with pytest.raises(ValueError):
            await buffer.get(3)

    asyncio.run(scenario())


SLOTS = {"learner": (0, 1), 0: (1, 2), 1: (3, 2)}  # a round: 1 learner group, then 2 per producer


def test_snapshot_keeps_slots_and_restore_continues_them():
    async def scenario():
        buffer = RolloutBuffer(capacity=10, slots=SLOTS)
        await buffer.put(["L0"], source="learner", round_index=0)
        await buffer.put(["a0", "a0'"], source=0, round_index=0)
        await buffer.put(["b0", "b0'"], source=1, round_index=0)
        await buffer.put(["a1", "a1'"], source=0, round_index=1)
        assert await buffer.get(3) == ["L0", "a0", "a0'"]
        state = await buffer.snapshot()
        assert state["items"] == [(0, 3, "b0"), (0, 4, "b0'"), (1, 1, "a1"), (1, 2, "a1'")]
        assert state["next"] == [0, 3] and state["rounds_put"] == {"learner": 1, 0: 2, 1: 1}
        # where a restarted producer continues (supervision.py): its first round not put
        assert [await buffer.next_round(source) for source in (0, 1, 2)] == [2, 1, 0]
        assert await buffer.size() == 4  # nothing was popped
        resumed = RolloutBuffer(capacity=10, slots=SLOTS)
        await resumed.restore(state)
        await resumed.put(["b1", "b1'"], source=1, round_index=1)
        await resumed.put(["L1"], source="learner", round_index=1)
        assert await resumed.get(7) == ["b0", "b0'", "L1", "a1", "a1'", "b1", "b1'"]
        with pytest.raises(ValueError, match="drawn already"):
            await resumed.put(["a1", "a1'"], source=0, round_index=1)

    asyncio.run(scenario())


def test_draw_order_within_a_round_does_not_depend_on_arrival_order():
    """Producer 1 and then the learner finish before producer 0: draws still follow the slots, so a step's
    groups are the same whichever actor was faster (exact resume, reproducible sync runs)."""
    async def scenario():
        buffer = RolloutBuffer(capacity=5, slots=SLOTS)
        await buffer.put(["b0", "b0'"], source=1, round_index=0)
        getter = asyncio.create_task(buffer.get(2))
        await asyncio.sleep(0.01)
        assert not getter.done()  # slot 0 (the learner's) is not filled yet
        await buffer.put(["L0"], source="learner", round_index=0)
        await asyncio.sleep(0.01)
        assert not getter.done()  # slot 1 is producer 0's
        await buffer.put(["a0", "a0'"], source=0, round_index=0)
        assert await getter == ["L0", "a0"]
        assert await buffer.get(3) == ["a0'", "b0", "b0'"]

    asyncio.run(scenario())


def test_rounds_are_drawn_in_order_when_one_producer_runs_ahead():
    """Producer 0 puts rounds 0 and 1 before producer 1 puts round 0: round 1 waits behind round 0."""
    async def scenario():
        slots = {0: (0, 2), 1: (2, 2)}
        buffer = RolloutBuffer(capacity=8, slots=slots)
        await buffer.put(["a0", "a0"], source=0, round_index=0)
        await buffer.put(["a1", "a1"], source=0, round_index=1)
        assert await buffer.get(2) == ["a0", "a0"]  # the open round's first slots are drawable at once
        getter = asyncio.create_task(buffer.get(2))
        await asyncio.sleep(0.01)
        assert not getter.done()  # round 1 is held: round 0 is not complete
        await buffer.put(["b0", "b0"], source=1, round_index=0)
        assert await getter == ["b0", "b0"]
        assert await buffer.get(2) == ["a1", "a1"]

    asyncio.run(scenario())


def test_protocol_errors_raise():
    async def scenario():
        buffer = RolloutBuffer(capacity=10, slots=SLOTS)
        with pytest.raises(ValueError, match="share of a round is 2"):
            await buffer.put(["a0"], source=0, round_index=0)
        with pytest.raises(ValueError, match="made of sources"):
            await buffer.put(["x", "y"], source=7, round_index=0)
        await buffer.put(["a0", "a0'"], source=0, round_index=0)
        with pytest.raises(ValueError, match="put twice"):
            await buffer.put(["a0", "a0'"], source=0, round_index=0)

    asyncio.run(scenario())


def test_readers_waiting_before_the_groups_arrive_share_one_draw():
    """Both ranks of a trainer group ask for a draw before the producer's round is in: one pop, one copy."""
    async def scenario():
        buffer = RolloutBuffer(capacity=8)
        readers = [asyncio.create_task(buffer.get(2, request_id="draw0", readers=2)) for _ in range(2)]
        await asyncio.sleep(0.01)
        await buffer.put([1, 2, 3, 4])
        assert [await reader for reader in readers] == [[1, 2], [1, 2]]
        assert await buffer.size() == 2 and buffer._shared == {}

    asyncio.run(scenario())
