"""vLLM's known-harmless records are dropped where they are made; everything else, a real failure above all,
passes. Records are made by the logging machinery on vLLM's own logger names (no vLLM needed here);
tests/rollout/test_vllm_backend.py checks the records a real engine makes at a weight load."""

from __future__ import annotations

import logging

import pytest

from coati.rollout import vllm_logs
from coati.rollout.vllm_logs import QuietVLLM, is_harmless, quiet_vllm_logs

RELOAD = "vllm.model_executor.model_loader.reload.layerwise"
CPU_WORKER = "vllm.v1.worker.cpu_worker"


class Caught(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture
def caught():
    """What reaches a handler on vLLM's root logger, with the filters installed as in an engine's process."""
    root, handler = logging.getLogger("vllm"), Caught()
    root.addHandler(handler)
    loggers = {name: logging.getLogger(name) for name in {known.logger for known in vllm_logs.HARMLESS}}
    before = {name: list(logger.filters) for name, logger in loggers.items()}
    yield handler.records
    root.removeHandler(handler)
    for name, logger in loggers.items():
        logger.filters[:] = before[name]


def messages(records):
    return [record.getMessage() for record in records]


def test_per_load_records_drop_and_real_failures_pass(caught):
    quiet_vllm_logs(tied_head=True, idle=frozenset({"Gemma2Model", "Gemma3Model"}))  # as idle_layers finds them
    reload = logging.getLogger(RELOAD)
    for layer in ("RotaryEmbedding", "Llama3RotaryEmbedding", "ParallelLMHead", "Gemma2Model", "Gemma3Model",
                  "QKVParallelLinear", "LlamaModel"):
        reload.warning("%s: Failed to load weights", layer)
    reload.warning("%s: Failed to load weights (shape mismatch)", "RowParallelLinear")
    reload.error("could not reload %s", "RotaryEmbedding")
    assert messages(caught) == ["QKVParallelLinear: Failed to load weights", "LlamaModel: Failed to load weights",
                                "RowParallelLinear: Failed to load weights (shape mismatch)",
                                "could not reload RotaryEmbedding"]


def test_an_untied_head_that_loads_nothing_is_a_real_failure(caught):
    quiet_vllm_logs(tied_head=False)
    logging.getLogger(RELOAD).warning("%s: Failed to load weights", "ParallelLMHead")
    assert messages(caught) == ["ParallelLMHead: Failed to load weights"]
    quiet_vllm_logs(tied_head=True)  # installing again replaces the filter, never stacks a second one
    logging.getLogger(RELOAD).warning("%s: Failed to load weights", "ParallelLMHead")
    assert len(caught) == 1
    assert sum(isinstance(f, QuietVLLM) for f in logging.getLogger(RELOAD).filters) == 1


def test_the_cpu_workers_repeats_and_preload_advice_drop_its_other_warnings_pass(caught):
    quiet_vllm_logs(tied_head=False)
    worker = logging.getLogger(CPU_WORKER)
    for _ in range(12):
        worker.warning("CPU backend doesn't allow to use `torch.set_num_threads` after the thread binding, skip it.")
    worker.warning("%s is not found in LD_PRELOAD. For best performance, ...", "libtcmalloc")
    worker.error("Out of memory while allocating the KV cache")
    worker.warning("libtcmalloc is loaded from LD_PRELOAD")  # worded otherwise: passes
    assert messages(caught) == ["Out of memory while allocating the KV cache", "libtcmalloc is loaded from LD_PRELOAD"]


def test_the_same_words_on_another_logger_pass(caught):
    quiet_vllm_logs(tied_head=True)
    logging.getLogger("vllm.model_executor.models.llama").warning("%s: Failed to load weights", "RotaryEmbedding")
    assert messages(caught) == ["RotaryEmbedding: Failed to load weights"]


def test_restated_choices_drop_with_their_arguments(caught):
    quiet_vllm_logs(tied_head=False)
    logging.getLogger("vllm.utils.torch_utils").warning(
        "OMP_NUM_THREADS=%s is set; leaving Torch threads at %d for serving. Multi-threaded torch CPU ops ...", "2", 2)
    logging.getLogger("vllm.config.vllm").warning(
        "Enforce eager set, disabling torch.compile, CUDAGraphs, and JIT kernel warmup. This is equivalent to ...")
    logging.getLogger("vllm.config.vllm").warning("Enforce eager is not supported on this platform")
    assert messages(caught) == ["Enforce eager is not supported on this platform"]
    assert all(known.why for known in vllm_logs.HARMLESS)


def test_the_ssm_cache_reset_drops_for_a_model_without_mamba_layers_only(caught):
    quiet_vllm_logs(tied_head=False)
    cpu = logging.getLogger("vllm.platforms.cpu")
    cpu.warning("Reset SSM cache type to float32 for accelerated GDN mamba backend '%s'.", "none")
    cpu.warning("Reset SSM cache type to float32 for accelerated GDN mamba backend '%s'.", "gdn")
    assert messages(caught) == ["Reset SSM cache type to float32 for accelerated GDN mamba backend 'gdn'."]


def test_idle_layers_are_found_by_what_they_hold():
    """A layer of computed buffers only, or of parameters an earlier layer holds (a tied head), is idle; a layer
    with a weight of its own is not, nor is its class when another instance holds one."""
    import torch

    class Scale(torch.nn.Module):  # Gemma's model-level layer: its own tensor is a computed buffer
        def __init__(self):
            super().__init__()
            self.register_buffer("normalizer", torch.tensor(8.0), persistent=False)
            self.embed = torch.nn.Embedding(4, 2)
            self.head = torch.nn.Linear(2, 4, bias=False)
            self.head.weight = self.embed.weight  # tied
            self.mixed = torch.nn.ModuleList([torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)])

    model = Scale()
    assert vllm_logs.idle_layers(model.modules()) == {"Scale"}  # Linear: the head is tied, the others are not
    model.head = torch.nn.Identity()
    model.tail = type("Head", (torch.nn.Module,), {})()
    model.tail.weight = model.embed.weight
    assert vllm_logs.idle_layers(model.modules()) == {"Scale", "Head"}


def test_a_layer_found_idle_is_dropped_by_what_it_is(caught):
    quiet_vllm_logs(tied_head=False, idle=frozenset({"Gemma3Model"}))
    reload = logging.getLogger(RELOAD)
    for layer in ("Gemma3Model", "Gemma3DecoderLayer"):
        reload.warning("%s: Failed to load weights", layer)
    assert messages(caught) == ["Gemma3DecoderLayer: Failed to load weights"]
