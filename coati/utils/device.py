"""The one rule for where a model lives and in which dtype, for every model holder outside the trainer plugins.

``device_rule`` is pure: (GPUs this process was granted, engine, role, dtype flag, trainer precision) ->
``ModelPlacement``. ``model_placement`` feeds it what this process was granted (``granted_gpus``: Ray's
``get_gpu_ids()`` inside an actor, the visible GPUs outside Ray) and is what model holders call; none of them
picks a device or dtype of its own.

The rule:
- no GPU granted: the CPU in float32 (``dtype="auto"``), as every CPU run has always been;
- GPUs granted: the first of them (Ray makes the granted GPUs the only visible ones, so that is ``cuda:0`` in an
  actor); ``dtype="auto"`` is bfloat16, or float16 when the trainer trains in fp16 (its logprobs are then
  computed in fp16, and a frozen model beside it should not be wider);
- trained models (the policy, the critic) load in float32 everywhere: the trainer plugin keeps fp32 master
  weights and casts to --precision itself;
- an explicit ``dtype`` (fp32/bf16/fp16) wins for frozen models, on the CPU too (bf16 on a CPU with AVX512-BF16
  or AMX is a measured choice, never a default).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from coati.registry.backends import BACKENDS, DEFAULT_BACKEND

ROLES = ("producer", "learner_generation", "evaluator", "reference", "reward_model", "evaluate", "policy", "critic")
TRAINED = ("policy", "critic")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
VLLM_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


@dataclass(frozen=True)
class ModelPlacement:
    device: torch.device
    dtype: torch.dtype

    @property
    def vllm_dtype(self) -> str:
        return VLLM_DTYPES[self.dtype]

    @property
    def on_gpu(self) -> bool:
        return self.device.type == "cuda"


def device_rule(gpus: Sequence[int], backend: str, role: str, dtype: str = "auto",
                trainer_precision: str = "fp32") -> ModelPlacement:
    """Where a model of ``role`` served by ``backend`` lives, given the local CUDA indices ``gpus`` granted to
    this process (empty: none), the ``dtype`` flag (auto/fp32/bf16/fp16) and the trainer's ``--precision``."""
    if role not in ROLES:
        raise ValueError(f"unknown model role {role!r}; one of {', '.join(ROLES)}")
    if backend not in BACKENDS:
        raise ValueError(f"unknown inference backend {backend!r}; one of {', '.join(BACKENDS)}")
    if dtype != "auto" and dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; one of auto, {', '.join(DTYPES)}")
    if trainer_precision not in DTYPES:
        raise ValueError(f"unknown trainer precision {trainer_precision!r}; one of {', '.join(DTYPES)}")
    device = torch.device("cuda", gpus[0]) if gpus else torch.device("cpu")
    if role in TRAINED:
        return ModelPlacement(device, torch.float32)
    if dtype != "auto":
        return ModelPlacement(device, DTYPES[dtype])
    if not gpus:
        return ModelPlacement(device, torch.float32)
    return ModelPlacement(device, torch.float16 if trainer_precision == "fp16" else torch.bfloat16)


def local_indices(ray_ids: Sequence, visible: str | None) -> list[int]:
    """torch's indices of the GPUs Ray granted (``ray_ids``: physical ids) given CUDA_VISIBLE_DEVICES
    (``visible``): an id's position in that list, or the id itself when nothing restricts visibility."""
    if visible is None or visible.strip() == "":
        return [int(i) for i in ray_ids]
    listed = [v.strip() for v in visible.split(",")]
    return [listed.index(str(i)) if str(i) in listed else int(i) for i in ray_ids]


def granted_gpus() -> list[int]:
    """The local CUDA indices this process may use: inside a Ray actor what Ray granted it (none when it asked
    for none, even where GPUs are visible); outside Ray the visible GPU of this LOCAL_RANK, or GPU 0."""
    if not torch.cuda.is_available():
        return []
    ray = sys.modules.get("ray")  # a process that never imported Ray is not one of its actors
    if ray is not None and ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None:
        return local_indices(ray.get_gpu_ids(), os.environ.get("CUDA_VISIBLE_DEVICES"))
    return [int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()]


def precision_name(dtype: torch.dtype) -> str:
    """The --precision name of a model dtype (fp32, bf16, fp16)."""
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]


def model_placement(role: str, backend: str = DEFAULT_BACKEND, dtype: str = "auto",
                    trainer_precision: str = "fp32") -> ModelPlacement:
    """``device_rule`` for this process's granted GPUs: what every model holder calls."""
    return device_rule(granted_gpus(), backend, role, dtype, trainer_precision)


def device_memory_metrics() -> dict[str, float]:
    """This process's peak CUDA memory so far (``torch.cuda.max_memory_allocated``, GiB) when it computes on a
    GPU; nothing on the CPU (the metrics of CPU runs stay as they were)."""
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return {}
    return {"gpu_max_allocated_gib": torch.cuda.max_memory_allocated() / 2**30}
