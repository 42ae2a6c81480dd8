"""Starting a trainer group: ``world_size`` Ray actors of one class that join one torch.distributed group.

Every trainer group (the RL run's consumers, an SFT/RM stage's trainers) starts the same way:

1. ``start_trainer_group``: one actor per rank, with that rank's Ray options (a placement-group bundle, or a
   plain CPU/GPU request; a CPU rank's process starts with the allocator settings of coati.utils.machine) and its
   torch thread budget, created as ``actor_class(**kwargs, rank=, num_threads=)``;
2. ``join_trainer_group``: rank 0 names the rendezvous (its node's address in the Ray cluster and a port,
   ``rendezvous_address``), then every rank's ``setup(address, port)`` runs at once (they join together).

The actor class is the caller's (this module knows no trainer): it takes ``rank`` and ``num_threads`` keywords
and has ``rendezvous_address()`` and ``setup(master_address, master_port)``.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from coati.utils.machine import CPU_TRAINER_MALLOC_ENV, usable_cores


def rendezvous_address(port: int | None = None) -> tuple[str, int]:
    """(address, port) for a trainer group's rendezvous, run on rank 0 (which hosts the store): the address its
    node has in the Ray cluster, ``port`` when given, else a free one."""
    import ray

    address = ray.util.get_node_ip_address()
    if port:
        return address, port
    with socket.socket() as sock:  # a free port; released now, bound again at once by rank 0's store
        sock.bind(("", 0))
        return address, sock.getsockname()[1]


def even_threads(world_size: int, cores: int | None = None) -> list[int]:
    """Each rank's torch threads when the group has this machine's ``cores`` to itself."""
    return [max(1, (cores or usable_cores()) // world_size)] * world_size


def one_unit_each(world_size: int) -> Callable[[int], dict]:
    """Ray options per rank without a placement group: a GPU each when the cluster has one per rank (the plugins
    then train there over nccl), else a CPU slot."""
    import ray

    gpus = {"num_gpus": 1} if ray.cluster_resources().get("GPU", 0) >= world_size else {}
    return lambda rank: {"num_cpus": 1, **gpus}


class RanksStuck(RuntimeError):
    """Trainer ranks that did not answer a call within its bound."""

    def __init__(self, ranks: list[int], method: str, bound: float):
        super().__init__(f"trainer rank(s) {ranks} gave no answer to {method} within {bound:.1f} s")
        self.ranks, self.method, self.bound = ranks, method, bound


@dataclass
class TrainerGroup:
    actors: list  # Ray actor handles, by rank

    def call(self, method: str, *args, deadlines=None) -> list:
        """Every rank's result of ``method(*args)`` (collective calls reach all ranks together). With
        ``deadlines`` (coati.cluster.deadlines.Deadlines) the wait has its bound for calls of ``method``: past it,
        ``RanksStuck`` names the ranks that did not answer (their peers wait for them in a collective)."""
        import ray

        refs = [getattr(actor, method).remote(*args) for actor in self.actors]
        bound = deadlines.bound(method) if deadlines is not None else None
        start = time.monotonic()
        _, pending = ray.wait(refs, num_returns=len(refs), timeout=bound)
        if pending:
            raise RanksStuck([rank for rank, ref in enumerate(refs) if ref in pending], method, bound)
        if deadlines is not None:
            deadlines.record(method, time.monotonic() - start)
        return ray.get(refs)

    def kill(self) -> None:
        import ray

        for actor in self.actors:
            ray.kill(actor)


def start_trainer_group(actor_class, world_size: int, kwargs: dict, threads: Sequence[int],
                        options: Callable[[int], dict]) -> TrainerGroup:
    """One ``actor_class`` actor per rank: ``options(rank)`` are its Ray options, ``threads[rank]`` its torch
    threads. Nothing is joined yet (``join_trainer_group``)."""
    import ray

    remote = ray.remote(actor_class)
    return TrainerGroup([remote.options(**with_cpu_allocator(options(rank))).remote(**kwargs, rank=rank,
                                                                                    num_threads=threads[rank])
                         for rank in range(world_size)])


def with_cpu_allocator(options: dict) -> dict:
    """A rank's Ray options with the allocator settings of a CPU trainer (``CPU_TRAINER_MALLOC_ENV``) when it is
    given no GPU; a GPU rank's as they are."""
    if options.get("num_gpus"):
        return options
    runtime_env = dict(options.get("runtime_env") or {})
    runtime_env["env_vars"] = {**CPU_TRAINER_MALLOC_ENV, **runtime_env.get("env_vars", {})}
    return {**options, "runtime_env": runtime_env}


def join_trainer_group(group: TrainerGroup, gather: Callable | None = None) -> list:
    """Rank 0 names the rendezvous, then every rank's ``setup`` runs at once; each rank's result, collected by
    ``gather`` (``ray.get`` unless given, e.g. a supervisor's that names a dead rank)."""
    import ray

    address, port = ray.get(group.actors[0].rendezvous_address.remote())
    return (gather or ray.get)([actor.setup.remote(address, port) for actor in group.actors])
