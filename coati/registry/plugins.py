"""Trainer plugins: one ``PluginSpec`` per layout implementation; ``--plugin`` names a family and the layout
flags (-t, -tp, -pp, -zero) pick the family's plugin that serves them (``plugin_for``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from coati.registry import lookup

PLUGIN_FAMILIES = ("torch", "colossalai")  # the first is the default
DEFAULT_PLUGIN_FAMILY = PLUGIN_FAMILIES[0]
ALL_PRECISIONS = ("fp32", "bf16", "fp16")
ANY_ZERO = (0, 1, 2, 3)
DCP, COLOSSAL = "torch-dcp", "colossalai"  # trainer-state formats (coati.plugins.state)


@dataclass(frozen=True)
class PluginSpec:
    name: str
    family: str
    serves: Callable[[int, int, int, int], bool]  # (num_trainers, tp, pp, zero) -> the family's plugin for it
    build: str  # "module:class", called as class([variant,] layout, mesh)
    variant: str | None = None
    distributed: bool = True  # runs on a torch.distributed group (False: one process, no tp/pp/zero)
    tensor_parallel: bool = False
    pipeline_parallel: bool = False
    zero_stages: tuple[int, ...] = ANY_ZERO
    zero_needs_mixed_precision: bool = False  # ZeRO only with bf16/fp16 compute
    pipeline_max_zero: int = 3  # the highest ZeRO stage together with pipeline parallelism
    precisions: tuple[str, ...] = ("fp32", "bf16")  # compute precisions it honours (fp16 needs a loss scaler)
    tp_model_families: tuple[str, ...] | None = None  # HF model_type it shards by tensors (None: any)
    pp_model_families: tuple[str, ...] = ("qwen2", "llama")  # HF model_type it can cut into pipeline stages
    gradient_checkpointing: bool = True
    zero_shards_parameters: bool = True  # ZeRO shards the fp32 parameters too (FSDP2), not only states/gradients
    full_module: bool = False  # full_module() is the trained module itself on every rank (unsharded)
    state_format: str = DCP  # the trainer-state checkpoint it writes
    reads_dcp_in: tuple[str, ...] = ALL_PRECISIONS  # precisions in which it reads a torch DCP trainer state
    trains_adapters: bool = False  # trains LoRA adapters on a frozen base
    packs_rows: bool = True  # runs the model's own forward on ragged micro-batches (--packing: one packed row)
    # runs two forwards (prompts, then responses on their KV cache) before one backward (--shared-prompts); DDP's
    # reducer expects one, and the sharded plugins were not tried
    shares_prompts: bool = False
    launch: str | None = None  # "module:function" run once per rank after the process group exists
    # its trainer state without pipeline stages stores a tied embedding once (no lm_head.weight): only the same
    # plugin without pipeline stages reads it back (ColossalAI's HybridParallel)
    ties_head_once_without_pp: bool = False

    def reads_state(self, state_format: str, precision: str) -> bool:
        """Whether it resumes a trainer state written in ``state_format`` while training in ``precision``."""
        if state_format == DCP:
            return precision in self.reads_dcp_in
        return state_format == self.state_format


# torch-pp's stages run coati.models.families.decoder_stage: the families whose pipelined step equals one process's
# (tests/plugins/test_equivalence.py) and whose stage forward gives the model's logits (the conformance matrix)
TORCH_PP_FAMILIES = ("qwen2", "llama", "gemma2", "granite", "cohere", "gemma3_text", "mistral", "qwen3", "phi3",
                     "olmo2", "glm4")


# torch-tp's plan (coati.plugins.torch_native: q/k/v/gate/up column-wise, o/down row-wise, the rest replicated) is
# right for these only: Phi3 and GLM4 fuse qkv_proj / gate_up_proj (no q_proj, gate_proj to shard), OLMo2 norms q and k
# over the whole projection, and per-head q/k norms (Qwen3, Gemma3) are replicated weights whose gradient each rank
# sees only for its own heads (docs/models.md)
TORCH_TP_FAMILIES = ("qwen2", "llama")


def _colossal(name: str, serves, **capabilities) -> PluginSpec:
    # pipeline stages: our own shardformer policy for Qwen2 under transformers 5 (plugins/colossal_policies.py)
    defaults = {"state_format": COLOSSAL, "reads_dcp_in": (), "pp_model_families": ("qwen2",),
                "zero_shards_parameters": False}
    return PluginSpec(name, "colossalai", serves, "coati.plugins.colossal:ColossalPlugin",
                      variant=name.removeprefix("colossalai-"), launch="coati.plugins.colossal:launch_colossalai",
                      **{**defaults, **capabilities})


def _plain(n: int, tp: int, pp: int, zero: int) -> bool:
    return tp == 1 and pp == 1 and zero == 0


# Within a family exactly one row serves a layout.
PLUGINS: dict[str, PluginSpec] = {spec.name: spec for spec in (
    # LoRA (trains_adapters): these run the peft model as it is (DDP and FSDP2 wrap or shard frozen and trained
    # parameters alike; ColossalAI's TorchDDP and LowLevelZero boost it whole and keep optimizer states, ZeRO
    # partitions and fp32 masters for the trained parameters only); tensor-parallel plans and pipeline stages
    # address the plain HF modules (ColossalAI 0.5.0's HybridParallel LoRA is pipeline-only and untested here).
    PluginSpec("single", "torch", lambda n, tp, pp, zero: _plain(n, tp, pp, zero) and n == 1,
               "coati.plugins.torch_single:SingleProcessPlugin", distributed=False, full_module=True,
               trains_adapters=True, shares_prompts=True),
    PluginSpec("torch-ddp", "torch", lambda n, tp, pp, zero: _plain(n, tp, pp, zero) and n > 1,
               "coati.plugins.torch_native:TorchNativePlugin", variant="ddp", full_module=True, trains_adapters=True),
    PluginSpec("torch-fsdp2", "torch", lambda n, tp, pp, zero: tp == 1 and pp == 1 and zero > 0,
               "coati.plugins.torch_native:TorchNativePlugin", variant="fsdp2", trains_adapters=True),
    PluginSpec("torch-tp", "torch", lambda n, tp, pp, zero: tp > 1, "coati.plugins.torch_native:TorchNativePlugin",
               variant="tp", tensor_parallel=True, tp_model_families=TORCH_TP_FAMILIES),
    PluginSpec("torch-pp", "torch", lambda n, tp, pp, zero: tp == 1 and pp > 1,
               "coati.plugins.torch_pipeline:TorchPipelinePlugin", pipeline_parallel=True, pipeline_max_zero=0,
               packs_rows=False, pp_model_families=TORCH_PP_FAMILIES),
    _colossal("colossalai-ddp", lambda n, tp, pp, zero: _plain(n, tp, pp, zero), reads_dcp_in=("fp32",),
              trains_adapters=True),
    _colossal("colossalai-zero", lambda n, tp, pp, zero: tp == 1 and pp == 1 and zero > 0, zero_stages=(1, 2),
              precisions=ALL_PRECISIONS, trains_adapters=True),
    _colossal("colossalai-hybrid", lambda n, tp, pp, zero: tp > 1 or pp > 1, tensor_parallel=True,
              pipeline_parallel=True, zero_stages=(0, 1, 2), zero_needs_mixed_precision=True, pipeline_max_zero=1,
              precisions=ALL_PRECISIONS, gradient_checkpointing=False, packs_rows=False,  # shardformer's forward
              tp_model_families=("qwen2",),  # ColossalAI 0.5.0's llama policy fails to import under transformers 5
              ties_head_once_without_pp=True),
)}


def plugin_spec(name: str) -> PluginSpec:
    return lookup(PLUGINS, name, "trainer plugin")


def plugin_for(family: str, num_trainers: int, tp: int, pp: int, zero_stage: int) -> str:
    """The family's plugin for this layout (torch: TP, PP, FSDP2 for ZeRO, DDP, single; colossalai:
    HybridParallel for TP/PP, LowLevelZero, TorchDDP)."""
    for spec in PLUGINS.values():
        if spec.family == family and spec.serves(num_trainers, tp, pp, zero_stage):
            return spec.name
    raise ValueError(f"unknown plugin family {family!r}; choose one of {', '.join(PLUGIN_FAMILIES)}")


def adapter_plugins() -> str:
    """The plugins that train LoRA adapters, for a line that names the fix."""
    return ", ".join(name for name, spec in PLUGINS.items() if spec.trains_adapters)


def families_with(capable: Callable[[PluginSpec], bool]) -> str:
    """The plugin families with a plugin that is ``capable``, for a line that names the fix."""
    return " or ".join(dict.fromkeys(spec.family for spec in PLUGINS.values() if capable(spec)))
