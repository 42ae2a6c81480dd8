"""usable_cores counts the cores this process may run on, not the machine's."""

import multiprocessing
import os

import pytest

from coati.cluster.trainer_group import even_threads
from coati.utils.machine import usable_cores


def _budgets_on_one_core(queue) -> None:
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    queue.put((usable_cores(), even_threads(2)))


def test_usable_cores_is_the_affinity_mask():
    assert usable_cores() == len(os.sched_getaffinity(0))


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this OS")
def test_a_process_pinned_to_one_core_sizes_its_threads_for_one():
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    process = context.Process(target=_budgets_on_one_core, args=(queue,))
    process.start()
    cores, budgets = queue.get(timeout=60)
    process.join(60)
    assert (cores, budgets) == (1, [1, 1])


def test_bf16_on_a_cpu_without_native_bf16_is_said_at_start(tmp_path):
    from coati.utils.machine import bf16_cpu_line, cpu_flags

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_vnni\n\nprocessor\t: 1\nflags\t\t: fpu\n")
    flags = cpu_flags(str(info))
    assert flags == {"fpu", "sse", "avx2", "avx512f", "avx512_vnni"}  # the first processor's
    assert bf16_cpu_line("bf16", 0, flags).startswith("--precision bf16 on a CPU without AVX512-BF16 or AMX")
    assert bf16_cpu_line("bf16", 0, flags | {"amx_bf16"}) is None
    assert bf16_cpu_line("bf16", 0, flags | {"avx512_bf16"}) is None
    assert bf16_cpu_line("bf16", 2, flags) is None  # trained on GPUs
    assert bf16_cpu_line("fp32", 0, flags) is None
    assert bf16_cpu_line("bf16", 0, cpu_flags(str(tmp_path / "none"))) is None  # flags unknown: nothing said
