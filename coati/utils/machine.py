"""How many CPU cores this process may use: the one count every thread budget and local cluster size starts from.

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
