"""vLLM's known-harmless log records, dropped in every process that runs a vLLM engine or worker.

vLLM logs at WARNING what is routine for coati (INFO is off already: coati/utils/actor_process.py). Per weight
load, the layerwise reload names each layer that received no tensor: a rotary embedding (its cos/sin cache is
computed, never loaded), Gemma2/3's model (its embedding normalizer, likewise) and a tied LM head (it shares the embedding's weight, and
``CoatiWorkerExtension.coati_load_weights`` rebuilds what the CPU kernel derived from it); two lines per
round, forever. Per engine, the CPU worker warns each time vLLM's own thread contexts call the
``torch.set_num_threads`` no-op it installed, and vLLM restates the choices coati makes on purpose (eager mode
on CPU, OMP_NUM_THREADS). Each is matched by its logger and the start of its message format (and for the layer
warnings by the layer's class), so a real failure (another layer that loaded nothing, an untied head) and any message
worded otherwise still come through, as do the engine's other warnings and errors.
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
    when: Callable[[logging.LogRecord, bool], bool] = lambda record, tied_head: True  # (record, the head is tied)


def _layer(record: logging.LogRecord) -> str:
    return str(record.args[0]) if isinstance(record.args, tuple) and record.args else ""


HARMLESS = (
    Harmless(_RELOAD, _FAILED_LOAD, "a rotary embedding's cos/sin cache is computed from the config, never loaded",
             lambda record, tied_head: _layer(record).endswith("RotaryEmbedding")),
    Harmless(_RELOAD, _FAILED_LOAD, "a tied LM head is the embedding's weight; the worker extension refreshes it",
             lambda record, tied_head: tied_head and _layer(record) == "ParallelLMHead"),
    Harmless(_RELOAD, _FAILED_LOAD, "Gemma2/3's embedding normalizer, sqrt(hidden_size), is a buffer of the model "
             "computed from the config, never loaded (tests/models/test_family_conformance.py: the engine agrees)",
             lambda record, tied_head: _layer(record) in ("Gemma2Model", "Gemma3Model")),
    Harmless("vllm.v1.worker.cpu_worker",
             "CPU backend doesn't allow to use `torch.set_num_threads` after the thread binding, skip it.",
             "vLLM's own thread contexts calling the no-op it installed; coati sets the threads before the engine"),
    Harmless("vllm.config.vllm", "Enforce eager set, disabling torch.compile, CUDAGraphs, and JIT kernel warmup.",
             "coati runs CPU engines eagerly on purpose (VLLMEngineOptions.enforce_eager)"),
    Harmless("vllm.config.vllm", "Inductor compilation was disabled by user settings,", "follows from eager mode"),
    Harmless("vllm.utils.torch_utils", "OMP_NUM_THREADS=%s is set; leaving Torch threads at %d for serving.",
             "coati sets OMP_NUM_THREADS to the producer's thread budget on purpose (VLLMBackend)"),
)


def is_harmless(record: logging.LogRecord, tied_head: bool) -> bool:
    """Whether ``record`` is one of ``HARMLESS`` (``tied_head``: the engine's model ties its LM head to the
    embedding)."""
    return any(record.name == known.logger and isinstance(record.msg, str)
               and record.msg.startswith(known.message) and known.when(record, tied_head)
               for known in HARMLESS)


class QuietVLLM(logging.Filter):
    """Drops ``HARMLESS`` records; every other record passes."""

    def __init__(self, tied_head: bool):
        super().__init__()
        self.tied_head = tied_head

    def filter(self, record: logging.LogRecord) -> bool:
        return not is_harmless(record, self.tied_head)


def quiet_vllm_logs(tied_head: bool) -> None:
    """Installs the filter on the loggers of ``HARMLESS`` in this process (again: replaces it), and drops the
    deprecation warning vLLM's kernel dispatcher triggers at import. Call before the engine starts (its start-up
    records) and in each worker process (the reload records are made there)."""
    for name in {known.logger for known in HARMLESS}:
        logger = logging.getLogger(name)
        for old in [f for f in logger.filters if isinstance(f, QuietVLLM)]:
            logger.removeFilter(old)
        logger.addFilter(QuietVLLM(tied_head))
    warnings.filterwarnings("ignore", message=r"`torch\.distributed\.reduce_op` is deprecated",
                            category=FutureWarning, module=r"vllm\.triton_utils\.dispatcher")
