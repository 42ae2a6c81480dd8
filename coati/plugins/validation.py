"""Start-up checks for a trainer layout: each raises ``ValueError`` with one line naming the problem and the fix.

Run them before any process group or model is built (the consumer and the CLI can call ``validate_layout``
with the HF config of the model to train).
"""

from __future__ import annotations

from dataclasses import dataclass

from coati.plugins.mesh import MeshShape

# Model families (HF ``config.model_type``) whose decoder the pipeline stage builders understand.
TORCH_PP_FAMILIES = ("qwen2", "llama")
COLOSSAL_PP_FAMILIES = ("qwen2",)  # our own shardformer policy (transformers 5); see colossal_policies.py
COLOSSAL_TP_FAMILIES = ("qwen2",)  # ColossalAI 0.5.0's llama policy fails to import under transformers 5
PRECISIONS = ("fp32", "bf16", "fp16")
TORCH_PLUGINS = ("single", "torch-ddp", "torch-fsdp2", "torch-tp", "torch-pp")
# The plugins that train LoRA adapters (--lora-rank): their forward runs through the peft model as it is (DDP,
# FSDP2 shard frozen and trainable parameters alike); tensor-parallel plans and pipeline stages address the
# plain HF modules, and ColossalAI's booster wraps peft models its own way.
ADAPTER_PLUGINS = ("single", "torch-ddp", "torch-fsdp2")


@dataclass(frozen=True)
class ParallelLayout:
    """How one trainer group of ``world_size`` ranks lays the model out (the rest is data parallel)."""

    tp_size: int = 1
    pp_size: int = 1
    zero_stage: int = 0
    precision: str = "fp32"

    def shape(self, world_size: int) -> MeshShape:
        return MeshShape(world_size, self.tp_size, self.pp_size)

    def dp_size(self, world_size: int) -> int:
        return self.shape(world_size).dp_size


def validate_layout(plugin: str, world_size: int, layout: ParallelLayout, model_config=None) -> None:
    """All checks for ``plugin`` on ``world_size`` ranks; ``model_config`` is the HF config (None: skip model checks)."""
    tp, pp = layout.tp_size, layout.pp_size
    shape = layout.shape(world_size)
    if tp < 1 or pp < 1:
        shape.validate()
    if layout.zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero stage must be 0, 1, 2 or 3 (got {layout.zero_stage})")
    if layout.precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)} (got {layout.precision!r})")
    shape.validate()
    if plugin == "single" and world_size != 1:
        raise ValueError(f"plugin 'single' trains in one process, not {world_size}; pick torch-ddp or a colossalai plugin")
    if plugin in ("single", "torch-ddp", "colossalai-ddp", "colossalai-zero") and (tp > 1 or pp > 1):
        raise ValueError(f"plugin {plugin!r} is data parallel only (got tp={tp}, pp={pp}); "
                         "use torch-tp/torch-pp or colossalai-hybrid")
    if plugin == "torch-tp" and pp > 1:
        raise ValueError(f"plugin 'torch-tp' does not pipeline (got pp={pp}); use torch-pp or colossalai-hybrid")
    if plugin == "torch-pp" and tp > 1:
        raise ValueError(f"plugin 'torch-pp' does not shard tensors (got tp={tp}); use colossalai-hybrid for tp x pp")
    if plugin == "colossalai-zero" and layout.zero_stage not in (1, 2):
        raise ValueError(f"colossalai-zero needs zero stage 1 or 2 (got {layout.zero_stage})")
    if plugin == "colossalai-hybrid" and layout.zero_stage > 2:
        raise ValueError(f"colossalai-hybrid supports zero stage 0, 1 or 2 (got {layout.zero_stage})")
    if plugin == "colossalai-hybrid" and layout.zero_stage > 0 and layout.precision == "fp32":
        raise ValueError("ColossalAI's HybridParallelPlugin refuses ZeRO in fp32; set precision bf16/fp16 "
                         "or use colossalai-zero (LowLevelZeroPlugin trains fp32)")
    if plugin == "colossalai-hybrid" and pp > 1 and layout.zero_stage > 1:
        raise ValueError("ColossalAI pipeline parallelism supports zero stage 0 or 1 only (got 2)")
    if plugin in TORCH_PLUGINS + ("colossalai-ddp",) and layout.precision == "fp16":
        raise ValueError(f"{plugin} trains in fp32 or bf16 (fp16 needs a loss scaler it does not have); "
                         "use --precision bf16, or colossalai-zero/colossalai-hybrid for fp16")
    if model_config is not None:
        validate_model(plugin, layout, model_config)


def validate_model(plugin: str, layout: ParallelLayout, config) -> None:
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
        if plugin.startswith("colossalai") and family not in COLOSSAL_TP_FAMILIES:
            raise ValueError(f"ColossalAI tensor parallelism has no working policy for {family!r} models "
                             f"here (supported: {', '.join(COLOSSAL_TP_FAMILIES)}); use torch-tp")
    if pp > 1:
        families = COLOSSAL_PP_FAMILIES if plugin.startswith("colossalai") else TORCH_PP_FAMILIES
        if family not in families:
            raise ValueError(f"pipeline parallelism has no stage policy for {family!r} models "
                             f"(supported: {', '.join(families)}); use pp_size 1")
        if layers is not None and layers % pp:
            raise ValueError(f"pp_size {pp} does not divide the model's {layers} decoder layers; "
                             f"pick a divisor of {layers}")
