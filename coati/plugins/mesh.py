"""The trainer group's mesh: its sizes, each rank's coordinates, and the process groups, worked out in one place.

Every layout lays the group out as a ``dp x pp x tp`` grid, tp fastest (``rank = (dp * pp_size + pp) * tp_size
+ tp``): tensor-parallel peers are neighbours (placement keeps consecutive ranks on one node) and ColossalAI's
``HybridParallelPlugin`` numbers its ``ProcessGroupMesh(dp, pp, tp)`` the same way.

- ``MeshShape`` is pure arithmetic (no torch.distributed): config validation, placement and checkpoint
  manifests use it without any process group.
- ``TrainerMesh`` is one rank's view of the live group: built once per trainer group, after the default group
  is up, and handed to every role's plugin, so the policy and a critic (PPO) share one set of sub-groups.
  The DeviceMesh and the sub-groups are created lazily, on the first plugin that asks (creating a group is
  collective: every rank asks in the same order because every rank runs the same plugin code).

ColossalAI's ``HybridParallelPlugin`` builds its own ``ProcessGroupMesh`` inside its constructor and takes no
groups from outside; ``ColossalPlugin`` hands it the sizes and reads this rank's coordinates from the mesh, so
under the colossalai plugins each role still owns ColossalAI's groups of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

AXES = ("dp", "pp", "tp")  # slowest to fastest


@dataclass(frozen=True)
class Coords:
    dp: int
    pp: int
    tp: int


@dataclass(frozen=True)
class MeshShape:
    """Sizes of a ``world_size``-rank trainer group laid out as ``dp x pp x tp`` (the rest of tp*pp is dp)."""

    world_size: int
    tp_size: int = 1
    pp_size: int = 1

    def validate(self) -> None:
        """ValueError (one line) unless tp and pp are >= 1 and tp*pp divides the world."""
        tp, pp = self.tp_size, self.pp_size
        if tp < 1 or pp < 1:
            raise ValueError(f"tensor/pipeline parallel sizes must be >= 1 (got tp={tp}, pp={pp})")
        if self.world_size % (tp * pp):
            raise ValueError(f"tp_size*pp_size = {tp}*{pp} = {tp * pp} does not divide the {self.world_size} "
                             f"trainers; use a trainer count that is a multiple of {tp * pp}")

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


@dataclass(eq=False)
class TrainerMesh:
    """This rank's place in a live trainer group, and the group's sub-groups (created once, on demand)."""

    shape: MeshShape
    rank: int = 0
    _groups: dict = field(default_factory=dict, repr=False)
    _device_mesh: object = field(default=None, repr=False)

    @classmethod
    def build(cls, tp_size: int = 1, pp_size: int = 1) -> "TrainerMesh":
        """The mesh of the default process group (a one-rank mesh without one)."""
        from coati.plugins.dist import world

        rank, world_size = world()
        shape = MeshShape(world_size, tp_size, pp_size)
        shape.validate()
        return cls(shape, rank)

    # --- sizes and this rank's coordinates (the names the plugins expose) ---
    @property
    def world_size(self) -> int:
        return self.shape.world_size

    @property
    def dp_size(self) -> int:
        return self.shape.dp_size

    @property
    def tp_size(self) -> int:
        return self.shape.tp_size

    @property
    def pp_size(self) -> int:
        return self.shape.pp_size

    @property
    def model_parallel_size(self) -> int:
        return self.shape.model_parallel_size

    @property
    def coords(self) -> Coords:
        return self.shape.coords(self.rank)

    @property
    def dp_rank(self) -> int:
        return self.coords.dp

    @property
    def pp_rank(self) -> int:
        return self.coords.pp

    @property
    def tp_rank(self) -> int:
        return self.coords.tp

    def first_in(self, axis: str) -> int:
        """Global rank of this rank's group's first member along ``axis`` (e.g. pipeline stage 0)."""
        return self.shape.group_of(axis, self.rank)[0]

    def last_in(self, axis: str) -> int:
        return self.shape.group_of(axis, self.rank)[-1]

    # --- process groups (collective on first use) ---
    def group(self, axis: str, single: bool = False):
        """This rank's process group along ``axis``; None when that axis has one rank, unless ``single`` (a group
        of one, for an API that needs a group object)."""
        if self.shape.size(axis) == 1 and not single:
            return None
        return self._subgroup(axis, self.shape.groups(axis))

    def stage_ends_group(self):
        """This rank's (first stage, last stage) group; None without pipeline stages or off the ends."""
        if self.pp_size == 1:
            return None
        return self._subgroup("pp_ends", self.shape.stage_ends())

    def _subgroup(self, key: str, layout: list[list[int]]):
        if key not in self._groups:
            import torch.distributed as dist

            mine = None
            for ranks in layout:  # every rank creates every group, in the same order (new_group is collective)
                group = dist.new_group(ranks)
                if self.rank in ranks:
                    mine = group
            self._groups[key] = mine
        return self._groups[key]

    def device_mesh(self, device_type: str):
        """The torch DeviceMesh over the group, dims ("dp", "tp") (and "pp" between them when pipelined)."""
        if self._device_mesh is None:
            from torch.distributed.device_mesh import init_device_mesh

            names = ("dp", "pp", "tp") if self.pp_size > 1 else ("dp", "tp")
            self._device_mesh = init_device_mesh(device_type, tuple(self.shape.size(n) for n in names),
                                                 mesh_dim_names=names)
        return self._device_mesh

    def close(self) -> None:
        """Destroy the sub-groups (the default group stays to its owner); after every plugin on it closed."""
        import torch.distributed as dist

        for group in set(self._groups.values()) - {None}:
            try:
                dist.destroy_process_group(group)
            except Exception:  # noqa: BLE001 - best effort; the default group stays
                pass
        self._groups.clear()
        self._device_mesh = None
