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
