"""The rollout buffer between producers and trainers: a bounded queue of groups, run as an async Ray actor.

``put`` waits while the buffer is full (back-pressure on producers); ``get`` waits until enough groups
exist. Ranks of one data-parallel replica that must see the same data (TP/PP peers) pass the same
``request_id`` with ``readers`` set to their count: the first caller pops, the others receive the same list.

Rounds: producers put whole rounds tagged with their rank (``source``) and the round index. With
``round_size`` set, groups are drawn in round order: a round's groups become drawable only once every earlier
round has been put completely (one producer racing ahead cannot push a slower producer's older round behind
its own newer ones, which would break the staleness bound of coati.distributed.schedule). Within the open
round, groups are drawn as they arrive. The buffer also counts the rounds each source has put, so
``snapshot`` (for checkpoints) returns the undrawn groups with their rounds and every producer's next round,
taken at one instant: a resumed run ``restore``s them and each producer regenerates from its first round not
put, so no group is lost or trained on twice.
"""

from __future__ import annotations

import asyncio
from collections import deque


class RolloutBuffer:
    def __init__(self, capacity: int, round_size: int | None = None):
        if capacity < 1:
            raise ValueError("buffer capacity must be at least 1 group")
        self.capacity, self.round_size = capacity, round_size
        self._ready: deque = deque()  # (round, group), drawable in this order
        self._held: dict[int, list] = {}  # round -> [(round, group)] put while an earlier round is incomplete
        self._put_count: dict[int, int] = {}  # round -> groups put so far, for rounds not complete yet
        self._open = 0  # the oldest round not completely put
        self._changed = asyncio.Condition()
        self._shared: dict[str, list] = {}  # request_id -> [groups, readers still to serve]
        self.total_put = 0
        self.total_got = 0
        self.rounds_put: dict = {}  # source -> rounds it has put (its next round index)

    def _size(self) -> int:
        return len(self._ready) + sum(len(items) for items in self._held.values())

    def _place(self, round_index: int | None, items: list) -> None:
        if self.round_size is None or round_index is None or round_index <= self._open:
            self._ready.extend(items)
        else:
            self._held.setdefault(round_index, []).extend(items)

    async def put(self, groups: list, source=None, round_index: int | None = None) -> None:
        if len(groups) > self.capacity:
            raise ValueError(f"cannot put {len(groups)} groups into a buffer of capacity {self.capacity}")
        async with self._changed:
            await self._changed.wait_for(lambda: self._size() + len(groups) <= self.capacity)
            self._place(round_index, [(round_index, group) for group in groups])
            if self.round_size is not None and round_index is not None:
                self._put_count[round_index] = self._put_count.get(round_index, 0) + len(groups)
                while self._put_count.get(self._open, 0) >= self.round_size:
                    del self._put_count[self._open]
                    self._open += 1
                    self._ready.extend(self._held.pop(self._open, []))
            self.total_put += len(groups)
            if source is not None:
                self.rounds_put[source] = max(self.rounds_put.get(source, 0), round_index + 1)
            self._changed.notify_all()

    async def get(self, count: int, request_id: str | None = None, readers: int = 1) -> list:
        if count > self.capacity:
            raise ValueError(f"cannot get {count} groups from a buffer of capacity {self.capacity}")
        async with self._changed:
            # Readers of one request may all be waiting before the groups exist: whichever wakes first pops,
            # the others must then find the shared entry, not pop the next groups as well.
            await self._changed.wait_for(lambda: (request_id is not None and request_id in self._shared)
                                         or len(self._ready) >= count)
            if request_id is not None and request_id in self._shared:
                entry = self._shared[request_id]
                entry[1] -= 1
                if entry[1] == 0:
                    del self._shared[request_id]
                return entry[0]
            groups = [self._ready.popleft()[1] for _ in range(count)]
            self.total_got += count
            if request_id is not None and readers > 1:
                self._shared[request_id] = [groups, readers - 1]
            self._changed.notify_all()
            return groups

    async def snapshot(self) -> dict:
        """The buffer's state at one instant, nothing removed: undrawn (round, group) pairs in draw order, the
        rounds put per source, and the open round's accounting. ``restore`` takes it back."""
        async with self._changed:
            held = [item for round_index in sorted(self._held) for item in self._held[round_index]]
            return {"items": list(self._ready) + held, "rounds_put": dict(self.rounds_put), "open_round": self._open,
                    "put_count": dict(self._put_count)}

    async def restore(self, state: dict) -> None:
        """A resumed run's starting state (a checkpoint's ``snapshot``), before any producer puts."""
        async with self._changed:
            self._open = state["open_round"]
            self._put_count = {int(r): n for r, n in state["put_count"].items()}
            for round_index, group in state["items"]:
                self._place(round_index, [(round_index, group)])
            self.rounds_put = dict(state["rounds_put"])
            self._changed.notify_all()

    async def size(self) -> int:
        return self._size()
