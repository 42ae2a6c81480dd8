"""Bucket layout and checksums of a weight version (pure): tensors laid out in aligned buckets for broadcasting,
zero-copy views back, and the per-bucket checksums that tell a faithful delivery from a broken one."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Iterable, Iterator

import torch

ALIGN = 8  # bytes: every tensor starts at a multiple of the widest element size


class WeightSyncError(RuntimeError):
    """Producers do not hold what the sender sent (checksums differ)."""


@dataclass(frozen=True)
class Slot:
    name: str
    dtype: str  # torch dtype name, e.g. "float32"
    shape: tuple[int, ...]
    bucket: int
    offset: int  # bytes into the bucket
    nbytes: int


def itemsize(dtype: str) -> int:
    return torch.empty((), dtype=getattr(torch, dtype)).element_size()


def plan_buckets(specs: Iterable[tuple[str, str, tuple[int, ...]]], bucket_bytes: int) -> tuple[list[Slot], list[int]]:
    """Lay tensors (name, dtype, shape), in order, into buckets of at most ``bucket_bytes``; a tensor never
    splits (a larger one gets a bucket of its own). Offsets and bucket sizes are multiples of ``ALIGN``.
    Returns (slots, bucket sizes in bytes)."""
    slots: list[Slot] = []
    sizes: list[int] = []
    for name, dtype, shape in specs:
        nbytes = math.prod(shape) * itemsize(dtype)
        padded = -(-nbytes // ALIGN) * ALIGN
        if not sizes or (sizes[-1] > 0 and sizes[-1] + padded > bucket_bytes):
            sizes.append(0)
        slots.append(Slot(name, dtype, tuple(shape), len(sizes) - 1, sizes[-1], nbytes))
        sizes[-1] += padded
    return slots, sizes


def layout_id(slots: list[Slot], sizes: list[int]) -> str:
    text = json.dumps([[s.name, s.dtype, list(s.shape), s.bucket, s.offset] for s in slots] + [sizes])
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def checksum(bucket: torch.Tensor) -> int:
    """Sum of the bucket's bytes read as 64-bit words, modulo 2^64 (as a signed int64): the order of the additions
    does not matter, so CPU and GPU agree; a native int64 sum runs at memory speed (an int32 sum widened to
    int64 was 16x slower)."""
    return int(bucket.view(torch.int64).sum())


def tensor_views(buckets: list[torch.Tensor], slots: list[Slot]) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) views into the buckets, without copying."""
    for slot in slots:
        raw = buckets[slot.bucket][slot.offset : slot.offset + slot.nbytes]
        yield slot.name, raw.view(getattr(torch, slot.dtype)).view(slot.shape)


def fill_buckets(named_tensors: list[tuple[str, torch.Tensor]], slots: list[Slot], buckets: list[torch.Tensor]) -> None:
    """Copy the tensors into their slots (padding bytes keep their values: receivers get them too)."""
    for (_, tensor), (_, view) in zip(named_tensors, tensor_views(buckets, slots)):
        view.copy_(tensor.detach())


def mismatches(table: torch.Tensor) -> list[tuple[int, int]]:
    """(member, bucket) pairs whose checksum differs from the sender's (row 0) in a [members, buckets] table."""
    bad = (table[1:] != table[0]).nonzero().tolist()
    return [(member + 1, bucket) for member, bucket in bad]
