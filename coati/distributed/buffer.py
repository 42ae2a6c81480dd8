"""The rollout buffer between producers and trainers: a bounded FIFO of groups, run as an async Ray actor.

``put`` waits while the buffer is full (back-pressure on producers); ``get`` waits until enough groups
exist. Ranks of one data-parallel replica that must see the same data (TP/PP peers) pass the same
``request_id`` with ``readers`` set to their count: the first caller pops, the others receive the same list.
"""

from __future__ import annotations

import asyncio
from collections import deque


class RolloutBuffer:
    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError("buffer capacity must be at least 1 group")
        self.capacity = capacity
        self._groups: deque = deque()
        self._changed = asyncio.Condition()
        self._shared: dict[str, list] = {}  # request_id -> [groups, readers still to serve]
        self.total_put = 0
        self.total_got = 0

    async def put(self, groups: list) -> None:
        if len(groups) > self.capacity:
            raise ValueError(f"cannot put {len(groups)} groups into a buffer of capacity {self.capacity}")
        async with self._changed:
            await self._changed.wait_for(lambda: len(self._groups) + len(groups) <= self.capacity)
            self._groups.extend(groups)
            self.total_put += len(groups)
            self._changed.notify_all()

    async def get(self, count: int, request_id: str | None = None, readers: int = 1) -> list:
        if count > self.capacity:
            raise ValueError(f"cannot get {count} groups from a buffer of capacity {self.capacity}")
        async with self._changed:
            # A later reader of a shared request may arrive while the first still waits for groups: it must
            # wait for that first pop too (not pop groups of its own), so the predicate also watches _shared.
            await self._changed.wait_for(lambda: request_id in self._shared or len(self._groups) >= count)
            if request_id is not None and request_id in self._shared:
                entry = self._shared[request_id]
                entry[1] -= 1
                if entry[1] == 0:
                    del self._shared[request_id]
                return entry[0]
            groups = [self._groups.popleft() for _ in range(count)]
            self.total_got += count
            if request_id is not None and readers > 1:
                self._shared[request_id] = [groups, readers - 1]
            self._changed.notify_all()
            return groups

    async def size(self) -> int:
        return len(self._groups)
