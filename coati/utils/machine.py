"""How many CPU cores this process may use: the one count every thread budget and local cluster size starts from;
whether this CPU computes in bfloat16 natively; and the allocator settings a CPU trainer's process starts with.

The cores a process may run on are its affinity mask, not the machine's core count: a Slurm allocation, a
``taskset`` or a cgroup cpuset gives a process fewer cores than ``os.cpu_count()`` reports, and torch threads
sized from the machine would then spin against each other on the cores actually granted.
"""

from __future__ import annotations

import os


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask where the OS has one), at least 1."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


# Instruction sets that make bfloat16 matmuls native on x86 CPUs (oneDNN uses them); without them torch converts,
# and bf16 ran slower than fp32 (docs/results.md: 0.26x fp32's matmul rate, a training step 3x fp32's).
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> set[str]:
    """This CPU's feature flags (empty where /proc/cpuinfo is not there)."""
    try:
        with open(cpuinfo, encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def bf16_cpu_line(precision: str, cluster_gpus: float, flags: set[str]) -> str | None:
    """The start line for --precision bf16 trained on a CPU without native bfloat16 (None otherwise; pure)."""
    if precision != "bf16" or cluster_gpus > 0 or not flags or flags & set(BF16_CPU_FLAGS):
        return None
    return ("--precision bf16 on a CPU without AVX512-BF16 or AMX: bf16 matmuls run below fp32's rate here (a "
            "training step measured 3x fp32's on such a CPU); --precision fp32 is faster")


# glibc's malloc serves every block above its mmap threshold (32 MiB at most) with a fresh mmap and unmaps it on
# free, so each step's large tensors (logits, activations) page-fault their memory in again and the kernel zeroes
# it. Trainer processes on a CPU start with these tunables instead: no mmap'd blocks and no trimming, freed memory
# stays in the heap for the next step (the process keeps its peak). Measured on SmolLM2-135M's shared-prompt step,
# 2 cores: 11.5-12.0 s a step against 14.5-17.5 s (docs/results.md).
CPU_TRAINER_MALLOC_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(2**40)}
# Inference actors (producers, the evaluator) start with torch's C++ log at ERROR: vLLM's CPU extension warns at
# each engine start through it ("NUMA binding: Using MEMBIND policy ..."), a line no user can act on; Python-side
# warnings, vLLM's own among them, are filtered by what they say instead (rollout/vllm_logs.py).
ENGINE_ACTOR_ENV = {"TORCH_CPP_LOG_LEVEL": "ERROR"}
