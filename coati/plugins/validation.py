"""Start-up checks for a trainer layout: each raises ``ValueError`` with one line naming the problem and the fix.

Run them before any process group or model is built (the consumer and the CLI can call ``validate_layout``
with the HF config of the model to train).
"""

from __future__ import annotations

from coati.parallel.dims import ParallelDims
from coati.registry.plugins import PLUGINS, PluginSpec, plugin_spec

def validate_layout(plugin: str, dims: ParallelDims, model_config=None) -> None:
    """All checks for ``plugin`` on ``dims``; ``model_config`` is the HF config (None: skip model checks)."""
    dims.validate()
    _validate_capabilities(plugin_spec(plugin), dims)
    if model_config is not None:
        validate_model(plugin, dims, model_config)


def _either(choices) -> str:
    """``0, 1 or 2``."""
    words = [str(choice) for choice in choices]
    return " or ".join([", ".join(words[:-1]), words[-1]] if len(words) > 1 else words)


def _validate_capabilities(spec: PluginSpec, layout: ParallelDims) -> None:
    """The layout against what the plugin can do (its row in coati.registry.plugins)."""
    plugin, tp, pp, zero, world_size = spec.name, layout.tp_size, layout.pp_size, layout.zero_stage, layout.world_size
    if not spec.distributed and world_size != 1:
        raise ValueError(f"plugin {plugin!r} trains in one process, not {world_size}; pick torch-ddp or a colossalai plugin")
    if not (spec.tensor_parallel or spec.pipeline_parallel) and (tp > 1 or pp > 1):
        raise ValueError(f"plugin {plugin!r} is data parallel only (got tp={tp}, pp={pp}); "
                         "use torch-tp/torch-pp or colossalai-hybrid")
    if not spec.pipeline_parallel and pp > 1:
        raise ValueError(f"plugin {plugin!r} does not pipeline (got pp={pp}); use torch-pp or colossalai-hybrid")
    if not spec.tensor_parallel and tp > 1:
        raise ValueError(f"plugin {plugin!r} does not shard tensors (got tp={tp}); use colossalai-hybrid for tp x pp")
    if zero not in spec.zero_stages:
        raise ValueError(f"{plugin} needs zero stage {_either(spec.zero_stages)} (got {zero})")
    if spec.zero_needs_mixed_precision and zero > 0 and layout.precision == "fp32":
        raise ValueError("ColossalAI's HybridParallelPlugin refuses ZeRO in fp32; set precision bf16/fp16 "
                         "or use colossalai-zero (LowLevelZeroPlugin trains fp32)")
    if pp > 1 and zero > spec.pipeline_max_zero:
        raise ValueError(f"{plugin} pipeline parallelism supports zero stage "
                         f"{_either(range(spec.pipeline_max_zero + 1))} only (got {zero})")
    if layout.precision not in spec.precisions:
        raise ValueError(f"{plugin} trains in {_either(spec.precisions)} (fp16 needs a loss scaler it does not "
                         "have); use --precision bf16, or colossalai-zero/colossalai-hybrid for fp16")


def validate_model(plugin: str, layout: ParallelDims, config) -> None:
    tp, pp = layout.tp_size, layout.pp_size
    family = getattr(config, "model_type", "?")
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    layers = getattr(config, "num_hidden_layers", None)
    if tp > 1:
        if heads is not None and heads % tp:
            raise ValueError(f"tp_size {tp} does not divide the model's {heads} attention heads; pick a divisor of {heads}")
        if kv_heads is not None and kv_heads % tp:
            raise ValueError(f"tp_size {tp} does not divide the model's {kv_heads} key/value heads; "
                             f"pick a divisor of {kv_heads}")
        inter = getattr(config, "intermediate_size", None)
        if inter is not None and inter % tp:
            raise ValueError(f"tp_size {tp} does not divide the MLP width {inter}")
        families = plugin_spec(plugin).tp_model_families
        if families is not None and family not in families:
            others = [name for name, spec in PLUGINS.items() if name != plugin and spec.tensor_parallel
                      and (spec.tp_model_families is None or family in spec.tp_model_families)]
            raise ValueError(f"{plugin} tensor parallelism has no working policy for {family!r} models "
                             f"here (supported: {', '.join(families)}); "
                             + (f"use {' or '.join(others)}" if others else "train it with tp_size 1"))
    if pp > 1:
        families = plugin_spec(plugin).pp_model_families
        if family not in families:
            raise ValueError(f"pipeline parallelism has no stage policy for {family!r} models "
                             f"(supported: {', '.join(families)}); use pp_size 1")
        if layers is not None and layers % pp:
            raise ValueError(f"pp_size {pp} does not divide the model's {layers} decoder layers; "
                             f"pick a divisor of {layers}")
