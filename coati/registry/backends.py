"""Inference backends: one ``BackendSpec`` per engine (``-b/--backend``)."""

from __future__ import annotations

from dataclasses import dataclass

from coati.registry import lookup

GiB = 2**30


@dataclass(frozen=True)
class BackendSpec:
    name: str
    build: str  # "module:function" (config, rank, placement) -> InferenceBackend
    preflight: str | None = None  # "module:function" (tensor_parallel_size): one ConfigError line when unusable here
    tensor_parallel: bool = False  # shards one engine over several GPUs (-ptp > 1)
    kv_cache_budget: bool = False  # memory: a fixed KV-cache budget (--vllm-*) instead of the generate cache
    cpu_runtime_bytes: float = 0.6 * GiB  # memory: an actor with the engine imported, before any model (CPU)
    sleeps: bool = False  # a colocated engine releases its GPU memory while its rank trains
    wraps_trained_module: str | None = None  # "module:class" (module, tokenizer, prompts per call): a colocated
    #   engine that generates with the trained module itself on plugins that yield it whole (no copy, no sync)
    colocates: bool = True  # can run inside a trainer rank (--colocate)
    takes_adapters: bool = False  # loads LoRA adapter tensors in place (else each version is merged first)
    max_adapter_rank: int | None = None  # the highest LoRA rank it takes (None: any); higher ranks are merged
    # Measured on a CPU: its generation with LoRA adapters / with full weights (None: not measured). --lora-sync
    # auto merges versions where this is large (coati/config/lora_sync.py).
    cpu_adapter_slowdown: float | None = None
    # The default engine of a user's model (-m without -b; coati/config/engine.py): the row of highest preference
    # whose offer here serves the model and the run. offer: "module:function" (the model's architectures) ->
    # EngineOffer, read without importing the engine; None: always installed, serves every causal LM.
    preference: int = 0
    offer: str | None = None
    # Prompt tokens one engine step prefills on a CPU (None: no step budget: transformers prefills each -imbs batch
    # whole). On a CPU vLLM never splits a prefill across steps (a seeded request's split prefill killed its engine:
    # coati/rollout/vllm_backend.py), so a step takes at least one whole sequence.
    cpu_step_tokens: int | None = None
    # What to change when the engine fails (coati/rollout/engine_guard.py puts it in the run's one stop line).
    failure_hint: str = "Check the engine's settings (-imbs, -mpt, -mnt) against the model"

    def cpu_step_budget(self, max_model_len: int) -> int | None:
        """The prompt tokens one step of this engine prefills on a CPU, for sequences of ``max_model_len``."""
        return None if self.cpu_step_tokens is None else max(self.cpu_step_tokens, max_model_len)

    def takes_adapters_of_rank(self, rank: int) -> bool:
        return self.takes_adapters and (self.max_adapter_rank is None or rank <= self.max_adapter_rank)


# The first row is the default engine of configs built in code and the fallback of a user's model.
BACKENDS: dict[str, BackendSpec] = {spec.name: spec for spec in (
    BackendSpec("transformers", build="coati.rollout.inference_backend:build_transformers_backend",
                wraps_trained_module="coati.rollout.inference_backend:TransformersBackend", takes_adapters=True,
                failure_hint="If memory ran out, lower -imbs (the engine's batch) or -mnt"),
    BackendSpec("vllm", build="coati.rollout.vllm_backend:build_vllm_backend",
                preflight="coati.rollout.vllm_backend:check_vllm_usable", tensor_parallel=True,
                kv_cache_budget=True, cpu_runtime_bytes=2.0 * GiB, sleeps=True, takes_adapters=True,
                max_adapter_rank=512,  # vLLM's largest max_lora_rank
                # SmolLM2-135M, 64 samples of the real-model demo, rank 16: 17-20 s with adapters, 2.7 s without
                cpu_adapter_slowdown=6.5,
                # the faster engine for a user's model (docs/results.md, The default engine)
                preference=1, offer="coati.rollout.vllm_backend:vllm_offer",
                cpu_step_tokens=4096,  # vLLM 0.32's default max_num_batched_tokens for an LLM on a CPU
                failure_hint="Try -b transformers (the reference engine) to tell a vLLM fault from the run's "
                             "settings; or lower --vllm-kv-cache-gb / --vllm-gpu-memory-utilization, -mpt or -mnt"),
)}

DEFAULT_BACKEND = next(iter(BACKENDS))


def backend_spec(name: str) -> BackendSpec:
    return lookup(BACKENDS, name, "inference backend")
