"""The store and group primitives of the collective weight sync: polling a TCPStore key without c10d's
warnings, a gloo/nccl group built straight from a store (no default process group), and pipelined broadcasts."""

from __future__ import annotations

import datetime
import time
from typing import Callable, Iterator

import torch
import torch.distributed as dist

POLL_MAX_S = 0.01  # longest sleep between two looks at the store (a look is one small TCP round trip)
IN_FLIGHT = 2  # buckets broadcast at once: the next one travels while this one is checksummed


def wait_key(store, key: str, stop: Callable[[], bool] = lambda: False, deadline: float | None = None) -> bool:
    """Poll until ``key`` exists (True), ``stop()`` or the deadline (False). ``store.wait`` with a timeout would
    log a c10d warning per expiry, so this polls with a growing sleep (1 ms to POLL_MAX_S)."""
    pause = 0.001
    while not store.check([key]):
        if stop() or (deadline is not None and time.monotonic() > deadline):
            return False
        time.sleep(pause)
        pause = min(pause * 2, POLL_MAX_S)
    return True


def make_group(store, generation: int, rank: int, size: int, backend: str, timeout_s: float):
    prefixed = dist.PrefixStore(f"g{generation}/pg", store)
    timeout = datetime.timedelta(seconds=timeout_s)
    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(prefixed, rank, size, options)
    return dist.ProcessGroupGloo(prefixed, rank, size, timeout)


def broadcast(group, tensor: torch.Tensor):
    """Start broadcasting ``tensor`` from rank 0; returns the work to ``wait()`` on."""
    options = dist.BroadcastOptions()
    options.rootRank, options.rootTensor = 0, 0
    return group.broadcast([tensor], options)


def pipelined(buckets: list[torch.Tensor], start: Callable[[int], tuple]) -> Iterator[tuple[int, torch.Tensor]]:
    """Broadcast buckets with up to IN_FLIGHT of them under way; yields (index, bucket) as each arrives.
    ``start(i)`` begins bucket i and returns (work, the tensor it fills)."""
    pending = []
    for index in range(len(buckets)):
        pending.append((index, *start(index)))
        if len(pending) == IN_FLIGHT:
            done, work, tensor = pending.pop(0)
            work.wait()
            yield done, tensor
    for done, work, tensor in pending:
        work.wait()
        yield done, tensor


def allreduce(group, tensor: torch.Tensor) -> None:
    group.allreduce([tensor], dist.AllreduceOptions()).wait()


def group_device(backend: str) -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
