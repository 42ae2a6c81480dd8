"""The WeightStore actor: the newest published weights version, its object refs and the collective sender's
address. Its own module, free of torch: the actor (one per run, beside the driver) then starts without importing
torch, and so does the driver, which creates it (about 3 s of CPU each on these machines)."""

from __future__ import annotations

import asyncio


class WeightStore:
    """A Ray actor (async) holding the newest published weights and their version number.

    The trainer publishes ``[ObjectRef]`` (wrapped in a list so Ray passes the reference, not the data);
    producers wait for a version at least as new as the one they need.
    """

    def __init__(self):
        self.version = 0
        self.refs: list | None = None  # None under --weight-sync collective: the weights travel in the group
        self.address: tuple[str, int] | None = None  # --weight-sync collective: the sender's store
        self._changed = asyncio.Condition()

    async def set_rendezvous(self, address: tuple[str, int]) -> None:
        async with self._changed:
            self.address = address
            self._changed.notify_all()

    async def rendezvous(self, timeout_s: float | None = None) -> tuple[str, int] | None:
        """The collective sender's store address once it exists; None after ``timeout_s``."""
        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(lambda: self.address is not None), timeout_s)
            except asyncio.TimeoutError:
                return None
            return self.address

    async def publish(self, version: int, refs: list) -> None:
        async with self._changed:
            if version <= self.version:
                raise ValueError(f"weight version must increase: got {version} after {self.version}")
            self.version, self.refs = version, refs
            self._changed.notify_all()

    async def wait_for(self, version: int, timeout_s: float | None = None) -> tuple[int, list | None]:
        """Block until a version >= ``version`` exists; returns (version, refs)."""
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(lambda: self.version >= version), timeout_s)
            return self.version, self.refs

    async def latest(self) -> tuple[int, list | None]:
        return self.version, self.refs
