"""Trainer plugins: one protocol (``TrainerPlugin``), one implementation per parallel layout, each a row of
``coati.registry.plugins`` (its family, the layouts it serves, its capabilities, its class).

| name | layout | module |
|---|---|---|
| single | one process | torch_single |
| torch-ddp | DistributedDataParallel | torch_native |
| torch-fsdp2 | fully_shard (ZeRO; stage 3 reshards after forward) | torch_native |
| torch-tp | DTensor tensor parallel (x FSDP2 over dp when dp > 1) | torch_native |
| torch-pp | torch.distributed.pipelining GPipe (x DDP-style all-reduce over dp) | torch_pipeline |
| colossalai-ddp | ColossalAI TorchDDPPlugin | colossal |
| colossalai-zero | ColossalAI LowLevelZeroPlugin (stage 1 or 2) | colossal |
| colossalai-hybrid | ColossalAI HybridParallelPlugin (tp / pp / zero) | colossal |

Every multi-rank plugin reads its sizes, coordinates and sub-groups from one ``TrainerMesh`` (``coati.plugins.mesh``).
Multi-rank plugins need ``torch.distributed`` initialised first (``coati.plugins.dist.init_trainer_group``).
Mixed precision (``precision`` bf16: fp32 masters, bf16 compute): ``coati.plugins.precision``; AdamW, weight decay,
learning-rate schedules and gradient checkpointing: ``coati.plugins.optim``.
Trainer-state checkpoints (``save_state`` / ``load_state``, resumable in other layouts): ``coati.plugins.state``.
"""

from typing import TYPE_CHECKING

from coati.parallel.dims import ParallelDims
from coati.plugins.mesh import TrainerMesh
from coati.plugins.validation import validate_layout
from coati.registry import resolve
from coati.registry.plugins import PLUGINS as PLUGIN_SPECS
from coati.registry.plugins import plugin_spec

if TYPE_CHECKING:
    from coati.plugins.base import TrainerPlugin

# This face imports nothing that imports torch (config/ reads validate_layout through it); the protocol and the
# plugins themselves are imported from their modules, a plugin's when make_plugin resolves its row.
PLUGINS = tuple(PLUGIN_SPECS)


def make_plugin(name: str, tp_size: int = 1, pp_size: int = 1, zero_stage: int = 0, precision: str = "fp32",
                world_size: int | None = None, model_config=None, mesh: TrainerMesh | None = None) -> "TrainerPlugin":
    """The plugin ``name`` (a row of coati.registry.plugins) for a layout; with ``world_size`` (and
    ``model_config``) the layout is validated now.

    Without ``world_size`` the checks run in ``setup``, against the initialised group. Under pipeline
    parallelism the micro-batches given to one ``forward_backward`` call are the pipeline's micro-batches
    (at least ``pp_size`` of them per call; ColossalChat's ``microbatch_size = tmbs // pp`` is the case of
    passing micro-batches of ``tmbs // pp`` samples). ``mesh``: the trainer group's mesh, shared by every
    plugin built with it (the roles of one group); without it the plugin builds its own in ``setup``.
    """
    spec = plugin_spec(name)
    dims = ParallelDims(world_size or 1, tp_size, pp_size, zero_stage, precision)
    if world_size is not None:
        validate_layout(name, dims, model_config)
    if not spec.distributed:
        if tp_size != 1 or pp_size != 1 or zero_stage != 0:
            raise ValueError(f"plugin {name!r} has no tp/pp/zero (got tp={tp_size}, pp={pp_size}, zero={zero_stage})")
        return resolve(spec.build)(dims)
    return resolve(spec.build)(*([spec.variant] if spec.variant else []), dims, mesh=mesh)


__all__ = ["PLUGINS", "TrainerMesh", "make_plugin", "validate_layout"]
