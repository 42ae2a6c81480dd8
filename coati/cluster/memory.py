"""Memory each actor of a run needs, from the model's shape and the flags (pure arithmetic, bytes).

Trainer rank (Adam):
- parameters P/mp per rank (mp = tp x pp): fp32; mixed precision (bf16/fp16) adds a compute-dtype copy (autocast's
  cast weights, ColossalAI's working weights beside its fp32 masters);
- gradients fp32 (for the fp32 masters; in fp32 runs the parameters' dtype); Adam's two fp32 states (8 bytes
  per parameter);
- sharding over dp: torch FSDP2 (-zero >= 1) shards the fp32 parameters, gradients and states, and holds the
  full parameters (in the compute dtype) of this rank's layers from forward to backward (-zero 1/2) or one
  layer's at a time (-zero 3); ColossalAI LowLevelZero / Hybrid: stage 1 shards states and master weights,
  stage 2 also gradients;
- activations kept for backward in the compute dtype, per token per layer 8H + (4 kv_dim + 4I)/tp elements (the
  tensors a Qwen2/Llama block saves: norms, q/k/v, attention output, gate/up/act/product), for micro-batch x
  sequence tokens (pp: the first stage holds pp micro-batches); with gradient checkpointing only each layer's
  input (H per token) is kept, plus one layer's full set while it is recomputed; the logits at
  3 x tokens x V/tp fp32 (logits, log-softmax, gradient; the entropy metric works in 64 MiB slices beside them,
  ``coati.algorithm.loss.token_entropy``: benchmarks/bench_trainer_memory.py measures this on CPU);
- the reference model (KL > 0) whole on every rank; the process's own runtime (CPU: Python, torch, Ray);
- with LoRA (``adapter_params`` > 0): the frozen base as loaded (fp32, sharded like the weights under FSDP2) and
  no master copy; gradients and Adam states for the adapters only (``ModelShape.adapter_params``); no reference
  model (it is the base with the adapters off); a published version is the adapters alone. ColossalAI's ZeRO
  holds the base in the compute dtype and shards the adapters' masters, states (and stage-2 gradients).
Inferencer: weights / ptp, the KV cache (vLLM: its budget; transformers: the generate cache of its -imbs samples
per call and their logits, three copies at the peak),
the received weight version (a CPU copy: object store or collective staging), the runtime. The sending trainer
rank also holds the published version twice over (``publish_bytes``).

The runtime constants were measured on this project's CPU machine (docs/results.md, "Memory plan").
"""

from __future__ import annotations

from dataclasses import dataclass

from coati.parallel.dims import ParallelDims
from coati.registry.backends import backend_spec
from coati.registry.plugins import DEFAULT_PLUGIN_FAMILY, plugin_for, plugin_spec

GiB = 2**30
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
CPU_RUNTIME = 0.6 * GiB  # a Ray actor with torch and transformers imported, before any model


@dataclass(frozen=True)
class ModelShape:
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    tied: bool = True
    qkv_bias: bool = True

    @classmethod
    def from_config(cls, config: dict) -> ModelShape:
        """From an HF ``config.json`` (dict) of a Llama-family model (Qwen2, Llama, Mistral)."""
        heads = config["num_attention_heads"]
        return cls(vocab=config["vocab_size"], hidden=config["hidden_size"], layers=config["num_hidden_layers"],
                   heads=heads, kv_heads=config.get("num_key_value_heads") or heads,
                   intermediate=config["intermediate_size"], tied=bool(config.get("tie_word_embeddings", False)),
                   qkv_bias=config.get("model_type") == "qwen2" or bool(config.get("attention_bias", False)))

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * (self.hidden // self.heads)

    @property
    def layer_params(self) -> int:
        h, kv = self.hidden, self.kv_dim
        bias = (h + 2 * kv) if self.qkv_bias else 0
        return 2 * h * h + 2 * h * kv + bias + 3 * h * self.intermediate + 2 * h

    def projections(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each linear projection of one decoder block, by module name."""
        h, kv, inter = self.hidden, self.kv_dim, self.intermediate
        return {"q_proj": (h, h), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (h, h),
                "gate_proj": (h, inter), "up_proj": (h, inter), "down_proj": (inter, h)}

    def adapter_params(self, rank: int, targets: tuple[str, ...] = ("all-linear",)) -> int:
        """Parameters of rank-``rank`` LoRA adapters (A: r x in, B: out x r) on the named projections of every
        block (``all-linear``: all seven)."""
        chosen = self.projections() if "all-linear" in targets else {
            name: dims for name, dims in self.projections().items() if name in targets}
        return self.layers * sum(rank * (fan_in + fan_out) for fan_in, fan_out in chosen.values())

    @property
    def params(self) -> int:
        embedding = self.vocab * self.hidden * (1 if self.tied else 2)
        return embedding + self.layers * self.layer_params + self.hidden


@dataclass(frozen=True)
class MemoryLayout:
    """What the memory arithmetic reads of a trainer group: its degrees (``config.layout.TrainerLayout.parallel_dims``)
    and what else changes a rank's bytes."""

    dims: ParallelDims = ParallelDims()
    plugin: str = DEFAULT_PLUGIN_FAMILY  # the family (coati.registry.plugins)
    checkpointing: bool = False  # gradient (activation) checkpointing of the decoder layers
    adapter_params: int = 0  # LoRA adapters' parameters (0: every weight trains)


def trainer_states(shape: ModelShape, layout: MemoryLayout) -> dict[str, float]:
    """Bytes per rank of parameters (incl. fp32 masters and gathered full parameters), gradients, Adam."""
    dims = layout.dims
    local = shape.params / dims.model_parallel_size
    b = DTYPE_BYTES[dims.precision]
    mixed = dims.precision != "fp32"
    dp, zero = dims.dp_size, dims.zero_stage
    spec = plugin_spec(plugin_for(layout.plugin, dims.world_size, dims.tp_size, dims.pp_size, zero))
    if layout.adapter_params and zero >= 1 and not spec.zero_shards_parameters:
        return _colossal_zero_adapters(local, layout.adapter_params / dims.model_parallel_size, dims)
    if layout.adapter_params:  # a frozen base as loaded (no masters), adapters with gradients and Adam
        adapters = layout.adapter_params / dims.model_parallel_size
        base = 4 * local / dp + b * local if spec.zero_shards_parameters and zero >= 1 else 4 * local
        return {"weights": base + 4 * adapters, "gradients": 4 * adapters, "optimizer": 8 * adapters}
    if spec.zero_shards_parameters and zero >= 1:  # FSDP2: fp32 shards; full parameters (compute dtype) while computing
        gathered = local if zero < 3 else 2 * shape.layer_params / dims.tp_size  # this layer's and the prefetched one
        return {"weights": 4 * local / dp + b * gathered, "gradients": 4 * local / dp, "optimizer": 8 * local / dp}
    master = 4 * local / (dp if zero >= 1 else 1) if mixed else 0.0
    grads = 4 * local  # fp32 gradients: of the fp32 parameters, or for ColossalAI's fp32 masters
    return {"weights": b * local + master, "gradients": grads / (dp if zero >= 2 else 1),
            "optimizer": 8 * local / (dp if zero >= 1 else 1)}


def _colossal_zero_adapters(local: float, adapters: float, dims: ParallelDims) -> dict[str, float]:
    """LoRA under ColossalAI's ZeRO: the whole model (frozen base and adapters) as working weights in the compute
    dtype; fp32 masters (mixed precision), gradients (stage 2) and Adam states of the adapters, sharded over dp."""
    b, dp = DTYPE_BYTES[dims.precision], dims.dp_size
    master = 4 * adapters / dp if dims.precision != "fp32" else 0.0
    return {"weights": b * (local + adapters) + master, "gradients": 4 * adapters / (dp if dims.zero_stage >= 2 else 1),
            "optimizer": 8 * adapters / dp}


def activation_bytes(shape: ModelShape, layout: MemoryLayout, micro_batch: int, seq_len: int) -> dict[str, float]:
    """Saved activations and logits of one micro-batch (its tokens: samples x sequence length) on a rank."""
    dims = layout.dims
    b = DTYPE_BYTES[dims.precision]
    tokens = micro_batch * seq_len
    per_layer = 8 * shape.hidden + (4 * shape.kv_dim + 4 * shape.intermediate) / dims.tp_size
    layers = shape.layers / dims.pp_size * dims.pp_size  # the first stage holds pp micro-batches of its layers
    kept = shape.hidden * layers + per_layer if layout.checkpointing else per_layer * layers
    return {"activations": b * tokens * kept, "logits": 3 * 4 * tokens * shape.vocab / dims.tp_size}


def trainer_memory(shape: ModelShape, layout: MemoryLayout, micro_batch: int, seq_len: int,
                   reference_bytes: int = 0, on_cpu: bool = True) -> dict[str, float]:
    """Every component of a trainer rank's peak, in bytes (``reference_bytes``: per parameter of the KL
    reference model, 0 without one); ``total`` is their sum."""
    out = {**trainer_states(shape, layout), **activation_bytes(shape, layout, micro_batch, seq_len)}
    out["reference"] = reference_bytes * shape.params
    out["runtime"] = CPU_RUNTIME if on_cpu else 0.0
    out["total"] = sum(out.values())
    return out


def colocated_memory(train: dict[str, float], engine: dict[str, float], engine_is_policy: bool,
                     optimizer_offloaded: bool, engine_sleeps: bool) -> dict[str, float]:
    """A colocated trainer rank's peak by phase, in bytes: ``train_phase`` (the trainer's whole peak, plus the
    engine's weights unless they are the policy's or asleep), ``generate_phase`` (the engine: its weights unless
    they are the policy's, KV cache, logits; plus what the trainer keeps resident: weights, optimizer states
    unless offloaded, reference, critic, runtime; gradients are freed by then); ``total`` is the larger, not
    the sum. ``train``: ``trainer_memory``'s components (a critic's states as ``critic``); ``engine``:
    ``inferencer_memory``'s."""
    engine_weights = 0.0 if engine_is_policy else engine["weights"]
    resident = ("weights", "reference", "critic", "runtime") + (() if optimizer_offloaded else ("optimizer",))
    train_phase = sum(v for k, v in train.items() if k != "total") + (0.0 if engine_sleeps else engine_weights)
    generate_phase = (engine_weights + engine.get("kv_cache", 0.0) + engine.get("logits", 0.0)
                      + sum(train.get(k, 0.0) for k in resident))
    return {"train_phase": train_phase, "generate_phase": generate_phase, "total": max(train_phase, generate_phase)}


def publish_bytes(shape: ModelShape, weight_sync: str, bucket_mb: float, dtype_bytes: int = 4,
                  params: int | None = None) -> float:
    """Host memory the sending trainer rank adds by publishing, at its peak: the gathered full weights and one
    more full copy (collective: the broadcast buckets it keeps to re-send a version to a restarted producer;
    object store: the packed copy it puts). Measured: 2.0x the fp32 weights over the other rank's peak
    (docs/results.md); ``bucket_mb`` does not change the total. ``params``: the parameters a version holds when
    not the whole model (LoRA: the adapters)."""
    return 2 * dtype_bytes * (shape.params if params is None else params)


def kv_bytes_per_token(shape: ModelShape, dtype_bytes: int) -> int:
    return 2 * shape.layers * shape.kv_dim * dtype_bytes


def inferencer_memory(shape: ModelShape, backend: str, dtype: str, ptp: int = 1, kv_cache_bytes: float = 0.0,
                      sequences: int = 1, seq_len: int = 0, new_tokens: int = 0, on_cpu: bool = True) -> dict[str, float]:
    """An inferencer's components in bytes: an engine with a KV-cache budget (vLLM) takes that budget
    (``kv_cache_bytes``); otherwise (transformers) the KV cache is the generate cache of ``sequences`` x ``seq_len``
    plus the logits it keeps (fp32, ``new_tokens`` each, three copies while the logprobs are taken).
    The received weight version is host memory (fp32, as the trainer sends it)."""
    b, spec = DTYPE_BYTES[dtype], backend_spec(backend)
    out = {"weights": b * shape.params / ptp}
    if spec.kv_cache_budget:
        out["kv_cache"] = kv_cache_bytes
    else:
        out["kv_cache"] = kv_bytes_per_token(shape, b) * sequences * seq_len
        # three copies at the peak: generate's kept logits, their stack scaled by the temperature, its log-softmax
        # (TransformersBackend._generate_batch); measured on the H100 within 2% (docs/results.md, "Defaults that fit")
        out["logits"] = 3 * 4.0 * sequences * new_tokens * shape.vocab
    out["received_weights"] = 4 * shape.params if on_cpu else 0.0
    out["runtime"] = spec.cpu_runtime_bytes if on_cpu else 0.0
    out["total"] = sum(out.values())
    return out
