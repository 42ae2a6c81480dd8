"""Colocated generation (``--colocate``): every trainer rank also generates, on its own device, in its own process.

Each rank is generator ``rank`` of the schedule (``ParallelConfig.rollout_sources``): at the start of round v
(after weights version v are in its engine) it samples and scores its ``-ibs`` prompts of the round with a
``RoundGenerator`` and puts the groups into the shared buffer under its slot (own_rounds.py, as the learner
does), exactly as producer ``rank`` would; every rank then draws the whole round through the normal shared
reads, so DAPO's filter, dynamic batching and every algorithm work unchanged. No inferencer actor, no object
store, no network for weights.

The engine:
- an unsharded plugin (one process, DDP) with the transformers engine generates with the trained module itself
  (``ParallelConfig.engine_is_policy``, ``TrainerPlugin.full_module``), from its fp32 master weights: no second copy,
  nothing to sync, and the behaviour logprobs come from exactly the weights being trained;
- otherwise the rank owns an engine of its own (transformers or vLLM, built as a producer's), and each publish
  loads the full weights into it tensor by tensor (``TrainerPlugin.named_full_tensors_everywhere``: sharded
  layouts gather, so the peak is one tensor beyond the engine, never a second full model).

Memory between the phases (``ColocatedPhases``), in this order every round: optimizer states to the host (with
``--offload-optimizer``), the trainer's cached CUDA blocks freed, the engine woken -> generate -> the engine
asleep, optimizer states back -> the round's optimizer steps -> the engine's weights woken and loaded. On the CPU
the moves and the sleep are no-ops but the order is the same code, recorded in ``phases`` for the tests.
"""

from __future__ import annotations

import torch

from coati.config.tree import RLConfig
from coati.models.lora import merged_tensors
from coati.registry import resolve
from coati.rollout.round_generator import RoundGenerator
from coati.trainer.own_rounds import OwnRounds


def move_optimizer_states(optimizer, device: torch.device) -> int:
    """Move every tensor of a torch optimizer's state to ``device`` in place; the bytes moved."""
    moved = 0
    inner = getattr(optimizer, "optim", optimizer)  # ColossalAI wraps the torch optimizer
    for state in getattr(inner, "state", {}).values():
        for key, value in state.items():
            if torch.is_tensor(value) and value.device != device:
                state[key] = value.to(device, non_blocking=False)
                moved += value.numel() * value.element_size()
    return moved


class ColocatedPhases:
    """The memory hand-over between generation and training on one rank, and the record of its order."""

    def __init__(self, plugins: list, engine, offload_optimizer: bool):
        self.plugins, self.engine, self.offload_optimizer = plugins, engine, offload_optimizer
        self.on_gpu = any(plugin.device.type == "cuda" for plugin in plugins)
        self.phases: list[str] = []
        self.peaks: dict[str, float] = {}  # GPU: each phase's torch.cuda.max_memory_allocated, GiB (this process)

    def _peak(self, phase: str) -> None:
        """Record the peak since the last mark as ``phase``'s, and start a new one."""
        if self.on_gpu:
            self.peaks[phase] = max(self.peaks.get(phase, 0.0), torch.cuda.max_memory_allocated() / 2**30)
            torch.cuda.reset_peak_memory_stats()

    def before_generate(self) -> None:
        if self.on_gpu and self.offload_optimizer:
            for plugin in self.plugins:
                move_optimizer_states(plugin.optimizer, torch.device("cpu"))
        if self.on_gpu:
            torch.cuda.empty_cache()  # blocks the trainer cached are invisible to another allocator (vLLM)
        _call(self.engine, "wake_up")
        self._peak("train")  # what came before was training (or the start)
        self.phases.append("generate")

    def after_generate(self) -> None:
        self._peak("generate")
        _call(self.engine, "sleep")
        if self.on_gpu and self.offload_optimizer:
            for plugin in self.plugins:
                move_optimizer_states(plugin.optimizer, plugin.device)
        self.phases.append("release")

    def before_load(self) -> None:
        _call(self.engine, "wake_up_weights")
        self.phases.append("load")

    def train(self) -> None:
        self.phases.append("train")

    def take_peaks(self) -> dict[str, float]:
        """The GPU peaks by phase since the last call (metrics ``gpu_generate_peak_gib``, ``gpu_train_peak_gib``)."""
        self._peak("train")
        peaks, self.peaks = self.peaks, {}
        return {f"gpu_{phase}_peak_gib": value for phase, value in peaks.items()}


def _call(engine, method: str) -> None:
    hook = getattr(engine, method, None)
    if hook is not None:
        hook()


class ColocatedGenerator(OwnRounds):
    def __init__(self, config: RLConfig, rank: int, plugin, tokenizer, extra_plugins=()):
        from coati.rollout.producer import make_backend

        self.config, self.rank, self.plugin = config, rank, plugin
        self.shares_module = config.parallel.engine_is_policy
        if self.shares_module:
            wrap = resolve(config.parallel.backend_spec.wraps_trained_module)
            self.backend = wrap(plugin.full_module(), tokenizer, config.batch.inference_microbatch_size)
        else:
            self.backend = make_backend(config, rank, who=f"trainer rank {rank}")
        super().__init__(RoundGenerator(config, rank, self.backend))
        self.phases = ColocatedPhases([plugin, *extra_plugins], self.backend, config.parallel.offload_optimizer)

    def evaluate(self, path: str, params, version: int) -> dict:
        return self.generating(lambda: self.rounds.evaluate(path, params, version))

    def generating(self, work):
        """Run ``work`` in the generation phase: the trained module in eval mode (when shared) and the trainer's
        RNG untouched."""
        module = self.plugin.full_module() if self.shares_module else None
        training = module.training if module is not None else False
        self.phases.before_generate()
        try:
            if module is not None:
                module.eval()
            return super().generating(work)
        finally:
            if module is not None:
                module.train(training)
            self.phases.after_generate()

    def load_weights(self) -> None:
        """Collective: the trained weights into the engine (nothing to do when it is the trained module)."""
        if self.shares_module:
            return
        self.phases.before_load()
        if self.config.merges_adapters:  # an engine without adapters: the merged weights, one module at a time
            tensors = self.plugin.named_full_tensors_everywhere(include_frozen=True)
            self.backend.load_weights(merged_tensors(tensors, self.config.model.lora))
        else:
            self.backend.load_weights(self.plugin.named_full_tensors_everywhere())
