"""Moving full policy weights from the trainers to the inferencers.

Transport: the trainer turns its (gathered) tensors into numpy arrays and ``ray.put``s them once; every
producer reads them zero-copy from the object store. Measured on a 2-core host: 4.5 GB/s for numpy arrays
versus 0.22 GB/s for pickled torch tensors. bfloat16 has no numpy dtype, so it travels as int16 bits.
"""

from __future__ import annotations

import asyncio
import warnings
from typing import Iterable, Iterator

import numpy as np
import torch

PackedWeights = dict[str, tuple[np.ndarray, str]]  # name -> (array, torch dtype name)


def pack_named_tensors(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> PackedWeights:
    packed: PackedWeights = {}
    for name, tensor in named_tensors:
        tensor = tensor.detach().cpu().contiguous()
        dtype_name = str(tensor.dtype).removeprefix("torch.")
        if tensor.dtype == torch.bfloat16:
            tensor = tensor.view(torch.int16)
        packed[name] = (tensor.numpy(), dtype_name)
    return packed


def unpack_named_tensors(packed: PackedWeights) -> Iterator[tuple[str, torch.Tensor]]:
    for name, (array, dtype_name) in packed.items():
        with warnings.catch_warnings():  # object-store arrays are read-only; the tensors are only read
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            tensor = torch.from_numpy(array)
        if dtype_name == "bfloat16":
            tensor = tensor.view(torch.bfloat16)
        yield name, tensor


def load_named_tensors(model: torch.nn.Module, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
    """Copy full tensors into ``model``'s parameters in place; returns how many were loaded.

    Every parameter must be covered (tied weights count once), and no unknown name may appear.
    """
    params = dict(model.named_parameters())  # tied parameters appear once here
    seen = set()
    with torch.no_grad():
        for name, tensor in named_tensors:
            if name not in params:
                raise KeyError(f"weight sync sent {name!r}, which the inference model does not have")
            params[name].copy_(tensor.to(params[name].dtype))
            seen.add(name)
    missing = set(params) - seen
    if missing:
        raise KeyError(f"weight sync did not send {len(missing)} parameters, e.g. {sorted(missing)[:3]}")
    return len(seen)


class WeightStore:
    """A Ray actor (async) holding the newest published weights and their version number.

    The trainer publishes ``[ObjectRef]`` (wrapped in a list so Ray passes the reference, not the data);
    producers wait for a version at least as new as the one they need.
    """

    def __init__(self):
        self.version = 0
        self.refs: list | None = None
        self._changed = asyncio.Condition()

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
