"""One trainer group's parallel layout: its degrees, their rules, and the rank arithmetic, without torch.

The group is a ``dp x pp x tp`` grid, tp fastest (``rank = (dp * pp_size + pp) * tp_size + tp``): tensor-parallel
peers are neighbours (placement keeps consecutive ranks on one node) and ColossalAI's ``HybridParallelPlugin``
numbers its ``ProcessGroupMesh(dp, pp, tp)`` the same way. dp is never given: it is what tp x pp leaves of the world.

The CLI's options (``config.layout.TrainerLayout.parallel_dims``), the plugins, the memory arithmetic and the
checkpoint manifests all take a ``ParallelDims``; the live process groups over it are ``plugins.mesh.TrainerMesh``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from coati.registry.plugins import ALL_PRECISIONS

AXES = ("dp", "pp", "tp")  # slowest to fastest
ZERO_STAGES = (0, 1, 2, 3)


@dataclass(frozen=True)
class Coords:
    dp: int
    pp: int
    tp: int


@dataclass(frozen=True)
class ParallelDims:
    """A ``world_size``-rank trainer group: tp x pp ranks hold one model copy, the rest of the world is dp; the
    ZeRO stage and compute precision it trains with. Checked by ``validate`` (not on construction: a plugin is
    built before it knows its world)."""

    world_size: int = 1
    tp_size: int = 1
    pp_size: int = 1
    zero_stage: int = 0
    precision: str = "fp32"

    def validate(self) -> None:
        """ValueError (one line) unless tp, pp >= 1, the ZeRO stage and precision exist and tp*pp divides the world."""
        tp, pp = self.tp_size, self.pp_size
        if tp < 1 or pp < 1:
            raise ValueError(f"tensor/pipeline parallel sizes must be >= 1 (got tp={tp}, pp={pp})")
        if self.zero_stage not in ZERO_STAGES:
            raise ValueError(f"zero stage must be 0, 1, 2 or 3 (got {self.zero_stage})")
        if self.precision not in ALL_PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(ALL_PRECISIONS)} (got {self.precision!r})")
        if self.world_size % (tp * pp):
            raise ValueError(f"tp_size*pp_size = {tp}*{pp} = {tp * pp} does not divide the {self.world_size} "
                             f"trainers; use a trainer count that is a multiple of {tp * pp}")

    def on_world(self, world_size: int) -> "ParallelDims":
        """The same layout over ``world_size`` ranks (a plugin learns its world when the group is up)."""
        return replace(self, world_size=world_size)

    @property
    def model_parallel_size(self) -> int:
        """Ranks that hold one data-parallel rank's micro-batches (tp * pp)."""
        return self.tp_size * self.pp_size

    @property
    def dp_size(self) -> int:
        return self.world_size // self.model_parallel_size

    def size(self, axis: str) -> int:
        return {"dp": self.dp_size, "pp": self.pp_size, "tp": self.tp_size}[axis]

    def coords(self, rank: int) -> Coords:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside the trainer group of {self.world_size}")
        return Coords(dp=rank // self.model_parallel_size, pp=(rank // self.tp_size) % self.pp_size,
                      tp=rank % self.tp_size)

    def rank_of(self, dp: int = 0, pp: int = 0, tp: int = 0) -> int:
        return (dp * self.pp_size + pp) * self.tp_size + tp

    def groups(self, axis: str) -> list[list[int]]:
        """Every group along ``axis`` (ranks that differ only in that coordinate), in creation order: by the
        other coordinates, slowest first."""
        others = [a for a in AXES if a != axis]
        out = []
        for first in range(self.size(others[0])):
            for second in range(self.size(others[1])):
                fixed = {others[0]: first, others[1]: second}
                out.append([self.rank_of(**{**fixed, axis: index}) for index in range(self.size(axis))])
        return out

    def group_of(self, axis: str, rank: int) -> list[int]:
        """The ranks in ``rank``'s group along ``axis``."""
        return next(group for group in self.groups(axis) if rank in group)

    def stage_ends(self) -> list[list[int]]:
        """Per (dp, tp): the first and the last pipeline stage's ranks (they hold tied embeddings' copies)."""
        return [[group[0], group[-1]] for group in self.groups("pp")]
