"""The trainer group's live mesh: this rank's place in it and the process groups, over one ``ParallelDims``.

The sizes, the ``dp x pp x tp`` numbering and every group's ranks are pure arithmetic in
``coati.parallel.dims.ParallelDims`` (config validation, placement and checkpoint manifests use it without any
process group). ``TrainerMesh`` is one rank's view of the live group: built once per trainer group, after the
default group is up, and handed to every role's plugin, so the policy and a critic (PPO) share one set of
sub-groups. The DeviceMesh and the sub-groups are created lazily, on the first plugin that asks (creating a group
is collective: every rank asks in the same order because every rank runs the same plugin code).

ColossalAI's ``HybridParallelPlugin`` builds its own ``ProcessGroupMesh`` inside its constructor and takes no
groups from outside; ``ColossalPlugin`` hands it the sizes and reads this rank's coordinates from the mesh, so
under the colossalai plugins each role still owns ColossalAI's groups of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from coati.parallel.dims import Coords, ParallelDims


@dataclass(eq=False)
class TrainerMesh:
    """This rank's place in a live trainer group, and the group's sub-groups (created once, on demand)."""

    dims: ParallelDims
    rank: int = 0
    _groups: dict = field(default_factory=dict, repr=False)
    _device_mesh: object = field(default=None, repr=False)

    @classmethod
    def build(cls, dims: ParallelDims = ParallelDims()) -> "TrainerMesh":
        """The mesh of ``dims`` (its tp/pp) over the default process group (a one-rank mesh without one)."""
        from coati.plugins.dist import world

        rank, world_size = world()
        dims = dims.on_world(world_size)
        dims.validate()
        return cls(dims, rank)

    # --- sizes and this rank's coordinates (the names the plugins expose) ---
    @property
    def world_size(self) -> int:
        return self.dims.world_size

    @property
    def dp_size(self) -> int:
        return self.dims.dp_size

    @property
    def tp_size(self) -> int:
        return self.dims.tp_size

    @property
    def pp_size(self) -> int:
        return self.dims.pp_size

    @property
    def model_parallel_size(self) -> int:
        return self.dims.model_parallel_size

    @property
    def coords(self) -> Coords:
        return self.dims.coords(self.rank)

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
        return self.dims.group_of(axis, self.rank)[0]

    def last_in(self, axis: str) -> int:
        return self.dims.group_of(axis, self.rank)[-1]

    # --- process groups (collective on first use) ---
    def group(self, axis: str, single: bool = False):
        """This rank's process group along ``axis``; None when that axis has one rank, unless ``single`` (a group
        of one, for an API that needs a group object)."""
        if self.dims.size(axis) == 1 and not single:
            return None
        return self._subgroup(axis, self.dims.groups(axis))

    def stage_ends_group(self):
        """This rank's (first stage, last stage) group; None without pipeline stages or off the ends."""
        if self.pp_size == 1:
            return None
        return self._subgroup("pp_ends", self.dims.stage_ends())

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
            self._device_mesh = init_device_mesh(device_type, tuple(self.dims.size(n) for n in names),
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
