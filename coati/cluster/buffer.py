"""The rollout buffer between producers and trainers: a bounded store of groups, run as an async Ray actor.

``put`` waits while the buffer is full (back-pressure on producers); ``get`` waits until enough groups can be
drawn. Ranks of one data-parallel replica that must see the same data (TP/PP peers) pass the same
``request_id`` with ``readers`` set to their count: the first caller pops, the others receive the same list.

Rounds (``slots`` given, from ``RolloutSchedule.slots``): every source (a producer rank, the learner) puts its
whole share of round r at once into its fixed slots of that round, and groups are drawn strictly in
(round, slot) order: a group becomes drawable once every slot before it is filled. So one producer racing
ahead cannot push a slower producer's older round behind its newer one (the staleness bound of
coati.cluster.schedule holds), and which groups a draw returns never depends on which source was faster
(sync runs are reproducible, resumes exact). A put into a slot that is filled or already drawn is a protocol
error and raises. ``snapshot`` (for checkpoints) returns the undrawn groups with their slots, the next slot to
draw and every source's count of rounds put, taken at one instant: a resumed run ``restore``s them and each
producer regenerates from its first round not put, so no group is lost or trained on twice.

Without ``slots`` the buffer is a plain FIFO.

The buffer stays responsive while every other actor may be busy, so it also answers the driver's question when a
step takes past its bound (``stall``): whether trainers are waiting for a round, and whose share of it is missing;
and each trainer rank ``note``s here the steps it has begun, so that a rank stuck before its step's collectives
stands out from its peers waiting in them.
"""

from __future__ import annotations

import asyncio
from collections import deque

_EMPTY = object()  # a slot not put yet


class RolloutBuffer:
    def __init__(self, capacity: int, slots: dict | None = None):
        if capacity < 1:
            raise ValueError("buffer capacity must be at least 1 group")
        self.capacity, self.slots = capacity, slots
        self.round_size = sum(count for _, count in slots.values()) if slots else None
        self._fifo: deque = deque()  # without slots
        self._rounds: dict[int, list] = {}  # round -> its slots, for rounds not completely drawn
        self._next = (0, 0)  # (round, slot) drawn next
        self._stored = 0  # groups in _rounds put and not drawn
        self._changed = asyncio.Condition()
        self._shared: dict[str, list] = {}  # request_id -> [groups, readers still to serve]
        self.total_put = 0
        self.total_got = 0
        self.rounds_put: dict = {}  # source -> rounds it has put (its next round index)
        self.waiting = 0  # get calls waiting for groups now
        self.notes: dict = {}  # who -> the last value it noted (a trainer rank: the steps it has begun)

    def _size(self) -> int:
        return len(self._fifo) + self._stored

    def _fill(self, round_index: int, first: int, groups: list) -> None:
        if (round_index, first) < self._next:
            raise ValueError(f"round {round_index} slot {first} was drawn already: a source put a round twice")
        slots = self._rounds.setdefault(round_index, [_EMPTY] * self.round_size)
        if any(slots[i] is not _EMPTY for i in range(first, first + len(groups))):
            raise ValueError(f"round {round_index} slots {first}..{first + len(groups) - 1} were put twice")
        slots[first : first + len(groups)] = groups
        self._stored += len(groups)

    def _walk(self, limit: int) -> list[tuple[int, int]]:
        """Up to ``limit`` (round, slot) positions drawable now, in draw order."""
        positions, (round_index, slot) = [], self._next
        while len(positions) < limit:
            slots = self._rounds.get(round_index)
            if slots is None or slots[slot] is _EMPTY:
                break
            positions.append((round_index, slot))
            round_index, slot = self._following(round_index, slot)
        return positions

    def _following(self, round_index: int, slot: int) -> tuple[int, int]:
        return (round_index + 1, 0) if slot + 1 == self.round_size else (round_index, slot + 1)

    def _drawable(self, count: int) -> bool:
        if self.slots is None:
            return len(self._fifo) >= count
        return len(self._walk(count)) >= count

    def _pop(self, count: int) -> list:
        if self.slots is None:
            return [self._fifo.popleft() for _ in range(count)]
        groups = []
        for round_index, slot in self._walk(count):
            groups.append(self._rounds[round_index][slot])
            if slot + 1 == self.round_size:
                del self._rounds[round_index]
                self._next = (round_index + 1, 0)
            else:
                self._rounds[round_index][slot] = None  # drawn
                self._next = (round_index, slot + 1)
        self._stored -= count
        return groups

    async def put(self, groups: list, source=None, round_index: int | None = None) -> None:
        """Add ``groups``; with slots, ``source``'s whole share of round ``round_index``."""
        if len(groups) > self.capacity:
            raise ValueError(f"cannot put {len(groups)} groups into a buffer of capacity {self.capacity}")
        if self.slots is not None:
            if source not in self.slots or round_index is None:
                raise ValueError(f"put from source {source!r} round {round_index!r}: the buffer's rounds are "
                                 f"made of sources {list(self.slots)}")
            first, count = self.slots[source]
            if len(groups) != count:
                raise ValueError(f"source {source!r} put {len(groups)} groups into round {round_index}; its share "
                                 f"of a round is {count}")
        async with self._changed:
            await self._changed.wait_for(lambda: self._size() + len(groups) <= self.capacity)
            if self.slots is None:
                self._fifo.extend(groups)
            else:
                self._fill(round_index, first, groups)
            self.total_put += len(groups)
            if source is not None and round_index is not None:
                self.rounds_put[source] = max(self.rounds_put.get(source, 0), round_index + 1)
            self._changed.notify_all()

    async def get(self, count: int, request_id: str | None = None, readers: int = 1) -> list:
        if count > self.capacity:
            raise ValueError(f"cannot get {count} groups from a buffer of capacity {self.capacity}")
        async with self._changed:
            # Readers of one request may all be waiting before the groups exist: whichever wakes first pops,
            # the others must then find the shared entry, not pop the next groups as well.
            self.waiting += 1
            try:
                await self._changed.wait_for(lambda: (request_id is not None and request_id in self._shared)
                                             or self._drawable(count))
            finally:
                self.waiting -= 1
            if request_id is not None and request_id in self._shared:
                entry = self._shared[request_id]
                entry[1] -= 1
                if entry[1] == 0:
                    del self._shared[request_id]
                return entry[0]
            groups = self._pop(count)
            self.total_got += count
            if request_id is not None and readers > 1:
                self._shared[request_id] = [groups, readers - 1]
            self._changed.notify_all()
            return groups

    async def snapshot(self) -> dict:
        """The buffer's state at one instant, nothing removed: undrawn (round, slot, group) triples in draw order
        (round and slot None without slots), the next (round, slot) to draw, and the rounds put per source.
        ``restore`` takes it back."""
        async with self._changed:
            items = [(None, None, group) for group in self._fifo]
            for round_index in sorted(self._rounds):
                start = self._next[1] if round_index == self._next[0] else 0
                items += [(round_index, slot, group) for slot, group in enumerate(self._rounds[round_index])
                          if slot >= start and group is not _EMPTY]
            return {"items": items, "next": list(self._next), "rounds_put": dict(self.rounds_put)}

    async def restore(self, state: dict) -> None:
        """A resumed run's starting state (a checkpoint's ``snapshot``), before any producer puts."""
        async with self._changed:
            self._next = tuple(state["next"])
            for round_index, slot, group in state["items"]:
                if round_index is None:
                    self._fifo.append(group)
                else:
                    self._fill(round_index, slot, [group])
            self.rounds_put = dict(state["rounds_put"])
            self._changed.notify_all()

    async def next_round(self, source) -> int:
        """The first round ``source`` has not put (where a restarted producer continues)."""
        return self.rounds_put.get(source, 0)

    async def note(self, who, value) -> None:
        self.notes[who] = value

    async def stall(self) -> dict:
        """What a draw waits for now: ``waiting`` get calls, and (with slots) the first slot not put, as its
        ``round`` and the ``source`` owning it; ``notes`` as noted."""
        missing = None
        if self.slots is not None and self.waiting:
            drawable = self._walk(self.capacity + 1)  # the buffer never holds more: the walk stops at a gap
            round_index, slot = self._following(*drawable[-1]) if drawable else self._next
            missing = {"round": round_index,
                       "source": next(s for s, (first, n) in self.slots.items() if first <= slot < first + n)}
        return {"waiting": self.waiting, "missing": missing, "notes": dict(self.notes)}

    async def size(self) -> int:
        return self._size()
