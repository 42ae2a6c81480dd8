"""Where trainer plugins compute: the device rule (coati.plugins.dist.trainer_device), micro-batches handed to
``loss_fn`` on ``plugin.device``, full tensors back on the CPU; and, on a CUDA machine, one step on the GPU
equal to the CPU step.

The rule is checked by injecting the situation into the queries it makes (``torch.distributed``'s group,
``torch.cuda``, and Ray's view of the actor), so it runs on this CPU-only machine. Every multi-rank layout's
devices are checked by tests/plugins/test_equivalence.py (``tests.plugins.equivalence`` records them).
"""

from __future__ import annotations

import sys
import types

import pytest
import torch
import torch.distributed as dist

from coati.plugins import dist as plugin_dist
from coati.plugins import make_plugin
from coati.algorithm.batch import split_micro_batches
from tests.plugins.equivalence import grpo_batch, grpo_loss_fn, tiny_model


def situation(monkeypatch, backend: str | None = None, cuda: bool = False, current: int = 0,
              actor_gpus: list | None = None):
    """A process whose default group uses ``backend`` (None: no group), which sees CUDA or not (current device
    ``current``), and which is a Ray actor holding ``actor_gpus`` (None: not a Ray actor)."""
    monkeypatch.setattr(dist, "is_initialized", lambda: backend is not None)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: backend)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current)
    if actor_gpus is None:
        monkeypatch.delitem(sys.modules, "ray", raising=False)
    else:
        context = types.SimpleNamespace(get_actor_id=lambda: "a1b2", get_accelerator_ids=lambda: {"GPU": actor_gpus})
        fake = types.SimpleNamespace(is_initialized=lambda: True, get_runtime_context=lambda: context)
        monkeypatch.setitem(sys.modules, "ray", fake)


def test_a_gloo_group_computes_on_the_cpu_even_with_gpus_visible(monkeypatch):
    situation(monkeypatch, backend="gloo", cuda=True, current=1)
    assert plugin_dist.trainer_device() == torch.device("cpu")
    assert plugin_dist.device_type() == "cpu"


def test_an_nccl_group_computes_on_this_ranks_gpu(monkeypatch):
    situation(monkeypatch, backend="nccl", cuda=True, current=3)
    assert plugin_dist.trainer_device() == torch.device("cuda", 3)
    assert plugin_dist.device_type() == "cuda"
    situation(monkeypatch, backend="cpu:gloo,cuda:nccl", cuda=True, current=0)
    assert plugin_dist.trainer_device() == torch.device("cuda", 0)


def test_without_a_group_the_gpu_is_used_only_when_this_process_was_given_one(monkeypatch):
    situation(monkeypatch, cuda=False)
    assert plugin_dist.trainer_device() == torch.device("cpu") and plugin_dist.default_backend() == "gloo"
    situation(monkeypatch, cuda=True, current=0)  # a plain process that sees a GPU
    assert plugin_dist.trainer_device() == torch.device("cuda", 0) and plugin_dist.default_backend() == "nccl"
    situation(monkeypatch, cuda=True, actor_gpus=[2])  # a Ray actor that reserved a GPU
    assert plugin_dist.trainer_device() == torch.device("cuda", 0) and plugin_dist.default_backend() == "nccl"
    # a Ray actor that reserved none still sees the node's GPUs (Ray leaves CUDA_VISIBLE_DEVICES alone)
    situation(monkeypatch, cuda=True, actor_gpus=[])
    assert plugin_dist.trainer_device() == torch.device("cpu") and plugin_dist.default_backend() == "gloo"


def test_to_device_moves_the_tensors_and_keeps_the_rest():
    batch = {"input_ids": torch.ones(2, 3, dtype=torch.long), "tag": "kept"}
    moved = plugin_dist.to_device(batch, torch.device("meta"))
    assert moved["input_ids"].device.type == "meta" and moved["input_ids"].dtype == torch.long
    assert moved["tag"] == "kept" and batch["input_ids"].device.type == "cpu"
    same = plugin_dist.to_device(batch, torch.device("cpu"))
    assert same["input_ids"] is batch["input_ids"]  # the CPU path hands over the very tensors, no copy


def _single_plugin():
    model, tokenizer = tiny_model()
    plugin = make_plugin("single")
    plugin.setup(model, 1e-4)
    batch = grpo_batch(model.config.vocab_size, tokenizer.pad_token_id)
    batch["normaliser"] = torch.full((batch["input_ids"].shape[0],), 10.0)
    return plugin, split_micro_batches(batch, 4)


def test_loss_fn_sees_micro_batches_on_the_plugin_device_and_full_tensors_come_back_on_the_cpu():
    plugin, micro_batches = _single_plugin()
    assert plugin.device == plugin_dist.trainer_device()
    assert {param.device for param in plugin.model.parameters()} == {plugin.device}
    seen = []

    def loss_fn(logits, micro_batch):
        seen.append({logits.device, *(tensor.device for tensor in micro_batch.values())})
        return grpo_loss_fn(logits, micro_batch)

    stats = plugin.forward_backward(micro_batches, loss_fn)
    assert len(seen) == len(micro_batches) == len(stats) and all(devices == {plugin.device} for devices in seen)
    assert all(isinstance(float(value), float) for s in stats for value in s.values())
    plugin.optimizer_step(1.0)
    values = plugin.forward_only(micro_batches, lambda logits, batch: (logits.device, batch["input_ids"].device))
    assert values == [(plugin.device, plugin.device)] * len(micro_batches)
    tensors = dict(plugin.named_full_tensors())
    assert tensors and {tensor.device for tensor in tensors.values()} == {torch.device("cpu")}


GPU_LOSS_TOL = 1e-4  # fp32 on both sides; kernels and reduction orders differ between CPU and CUDA
LR = 1e-4  # run_step's: one AdamW step moves a weight by at most ~lr, so weights agree within 2 lr


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
def test_single_and_ddp_layouts_train_on_cuda_like_on_the_cpu(tmp_path):
    """One GRPO step of single (no group) and torch-ddp (an nccl group: 2 ranks with 2 GPUs, else 1) on CUDA
    against the same step on the CPU (the ranks see no GPU)."""
    from plugin_group import max_abs_diff, run_group

    for name in ("cpu", "single", "ddp"):
        (tmp_path / name).mkdir()
    reference = run_group(["single"], 1, str(tmp_path / "cpu"), timeout_s=180)["single"]
    assert reference["device"] == "cpu"
    ranks = 2 if torch.cuda.device_count() >= 2 else 1
    results = {**run_group(["single"], 1, str(tmp_path / "single"), timeout_s=180, cuda=True),
               **run_group(["torch-ddp"], ranks, str(tmp_path / "ddp"), timeout_s=240, cuda=True)}
    for layout, result in results.items():
        assert result["device"].startswith("cuda"), f"{layout} trained on {result['device']}"
        assert result["loss_fn_devices"] == [result["device"]], f"{layout}: {result['loss_fn_devices']}"
        assert result["weight_devices"] == ["cpu"]
        assert abs(result["loss"] - reference["loss"]) <= GPU_LOSS_TOL, (layout, result["loss"], reference["loss"])
        assert abs(result["grad_norm"] - reference["grad_norm"]) <= 1e-3 * reference["grad_norm"], layout
        assert max_abs_diff(result["weights"], reference["weights"]) <= 2 * LR, layout
