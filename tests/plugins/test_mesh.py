"""The trainer mesh's arithmetic (no process group): sizes, every rank's coordinates, the groups along each axis,
against hand-written tables; and that the formulas the plugins used before the mesh give the same places."""

from __future__ import annotations

import pytest

from coati.parallel.dims import Coords, ParallelDims
from coati.plugins.mesh import TrainerMesh
from coati.plugins.validation import validate_layout

# rank -> (dp, pp, tp) for dp2 x pp2 x tp2 on 8 ranks, tp fastest
DP2_PP2_TP2 = {0: (0, 0, 0), 1: (0, 0, 1), 2: (0, 1, 0), 3: (0, 1, 1),
               4: (1, 0, 0), 5: (1, 0, 1), 6: (1, 1, 0), 7: (1, 1, 1)}
# dp4 x tp2 on 8 (torch-tp / hybrid without pipeline)
DP4_TP2 = {0: (0, 0, 0), 1: (0, 0, 1), 2: (1, 0, 0), 3: (1, 0, 1), 4: (2, 0, 0), 5: (2, 0, 1), 6: (3, 0, 0),
           7: (3, 0, 1)}
# dp2 x pp3 on 6 (torch-pp)
DP2_PP3 = {0: (0, 0, 0), 1: (0, 1, 0), 2: (0, 2, 0), 3: (1, 0, 0), 4: (1, 1, 0), 5: (1, 2, 0)}
# pp2 x tp3 on 6, dp 1
PP2_TP3 = {0: (0, 0, 0), 1: (0, 0, 1), 2: (0, 0, 2), 3: (0, 1, 0), 4: (0, 1, 1), 5: (0, 1, 2)}

TABLES = [(ParallelDims(8, tp_size=2, pp_size=2), DP2_PP2_TP2), (ParallelDims(8, tp_size=2), DP4_TP2),
          (ParallelDims(6, pp_size=3), DP2_PP3), (ParallelDims(6, tp_size=3, pp_size=2), PP2_TP3),
          (ParallelDims(4), {r: (r, 0, 0) for r in range(4)}), (ParallelDims(1), {0: (0, 0, 0)})]


@pytest.mark.parametrize("shape, table", TABLES, ids=[f"w{s.world_size}-tp{s.tp_size}-pp{s.pp_size}" for s, _ in TABLES])
def test_coordinates_of_every_rank(shape, table):
    assert {rank: shape.coords(rank) for rank in range(shape.world_size)} == \
        {rank: Coords(*place) for rank, place in table.items()}
    for rank, place in table.items():
        assert shape.rank_of(*place) == rank
    assert shape.dp_size * shape.pp_size * shape.tp_size == shape.world_size


def test_groups_along_each_axis_dp2_pp2_tp2():
    shape = ParallelDims(8, tp_size=2, pp_size=2)
    assert shape.groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert shape.groups("pp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert shape.groups("dp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert shape.stage_ends() == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert shape.group_of("dp", 6) == [2, 6] and shape.model_parallel_size == 4 and shape.dp_size == 2


def test_groups_in_the_order_torch_pp_created_them():
    """torch-pp made its pp groups by dp rank, its dp groups by stage, its tie groups by dp rank; the mesh keeps
    that order (new_group is collective: the order must be the same on every rank)."""
    dp, pp = 2, 3
    shape = ParallelDims(dp * pp, pp_size=pp)
    assert shape.groups("pp") == [[d * pp + s for s in range(pp)] for d in range(dp)]
    assert shape.groups("dp") == [[d * pp + s for d in range(dp)] for s in range(pp)]
    assert shape.stage_ends() == [[d * pp, d * pp + pp - 1] for d in range(dp)]


@pytest.mark.parametrize("world, tp, pp", [(8, 2, 2), (8, 2, 1), (6, 1, 3), (12, 3, 2), (4, 4, 1)])
def test_same_places_as_the_plugins_formulas(world, tp, pp):
    shape = ParallelDims(world, tp, pp)
    for rank in range(world):
        mesh = TrainerMesh(shape, rank)
        # ColossalAI's (dp, pp, tp) arithmetic, torch-tp's rank // tp, torch-pp's rank % pp / rank // pp
        assert mesh.dp_rank == rank // (tp * pp) and mesh.pp_rank == (rank // tp) % pp and mesh.tp_rank == rank % tp
        assert mesh.last_in("pp") == rank - mesh.pp_rank * tp + (pp - 1) * tp
        assert mesh.first_in("tp") == rank - rank % tp
    assert shape.dp_size == world // (tp * pp) == ParallelDims(world, tp_size=tp, pp_size=pp).dp_size


def test_one_line_errors():
    with pytest.raises(ValueError, match=r"tp_size\*pp_size = 2\*2 = 4 does not divide the 6 trainers"):
        ParallelDims(6, 2, 2).validate()
    with pytest.raises(ValueError, match="must be >= 1"):
        ParallelDims(4, 0, 1).validate()
    with pytest.raises(ValueError, match="does not divide the 6 trainers"):
        validate_layout("colossalai-hybrid", ParallelDims(6, tp_size=4))
    with pytest.raises(ValueError, match="outside the trainer group"):
        ParallelDims(4).coords(4)


def test_one_rank_mesh_without_a_process_group():
    mesh = TrainerMesh.build()
    assert (mesh.rank, mesh.world_size, mesh.dp_size) == (0, 1, 1)
    assert mesh.group("dp") is None and mesh.stage_ends_group() is None


def test_config_layouts_use_the_mesh():
    from coati.config.cli import build_parser, config_from_args

    argv = ["-m", "unused", "-d", "unused.jsonl", "-t", "8", "-tp", "2", "-pp", "2", "--plugin", "colossalai"]
    parallel = config_from_args(build_parser().parse_args(argv)).parallel
    assert parallel.parallel_dims == ParallelDims(8, 2, 2) and parallel.dp_size == 2


def test_dims_rules_for_zero_and_precision_and_a_later_world():
    with pytest.raises(ValueError, match=r"^zero stage must be 0, 1, 2 or 3 \(got 4\)$"):
        ParallelDims(2, zero_stage=4).validate()
    with pytest.raises(ValueError, match=r"^precision must be one of fp32, bf16, fp16 \(got 'fp8'\)$"):
        ParallelDims(2, precision="fp8").validate()
    built_alone = ParallelDims(tp_size=2, zero_stage=1, precision="bf16")  # a plugin before its group is up
    assert built_alone.on_world(8) == ParallelDims(8, 2, 1, 1, "bf16") and built_alone.on_world(8).dp_size == 4
