"""The run's supervisor on a real local Ray: a trainer rank that dies stops the run with one line naming it, and the
calls its peers had in flight fail quietly afterwards (no "Unhandled error" traceback after that line)."""

from __future__ import annotations

import gc
import os
import time

import pytest
import ray

from coati.cluster.connect import where
from coati.cluster.supervision import RunStopped, Supervisor


@ray.remote(num_cpus=0)
class Rank:
    def save(self, dies: bool) -> dict:
        if dies:
            time.sleep(0.3)
            os._exit(1)
        time.sleep(0.6)  # the peer's collective notices the lost rank
        raise RuntimeError("Read error: Connection reset by peer")


def unhandled_errors(monkeypatch) -> list:
    seen = []
    monkeypatch.setattr(ray._private.worker, "_unhandled_error_handler", seen.append)
    return seen


def stop_a_save(tmp_path, drain: bool) -> str:
    """rank 1 dies mid-save; rank 0's save fails 0.3 s later, before the driver kills it, as gloo's does."""
    ranks = [Rank.remote(), Rank.remote()]
    places = {"trainers": ray.get([rank.__ray_call__.remote(where) for rank in ranks])}
    supervisor = Supervisor(str(tmp_path), ranks, [], places)
    with pytest.raises(ray.exceptions.RayError) as failure:
        supervisor.gather([rank.save.remote(dies=(n == 1)) for n, rank in enumerate(ranks)])
    stopped = supervisor.stopped(failure.value)
    time.sleep(1.0)
    supervisor.kill_all()
    if drain:
        supervisor.drain()
    else:
        supervisor.in_flight = []
    assert isinstance(stopped, RunStopped)
    return str(stopped)


def settle() -> None:
    gc.collect()
    time.sleep(3.0)  # Ray reports an unfetched failure from a background thread once its ref is gone


def test_a_dead_rank_stops_the_run_with_one_line_and_its_peers_failures_stay_quiet(local_ray, tmp_path, monkeypatch):
    seen = unhandled_errors(monkeypatch)
    message = stop_a_save(tmp_path, drain=True)
    assert message.startswith("trainer rank 1 (pid ") and "died; the run stopped. No complete checkpoint" in message
    settle()
    assert seen == []


def test_an_undrained_peer_failure_is_what_ray_would_print_after_the_line(local_ray, tmp_path, monkeypatch):
    seen = unhandled_errors(monkeypatch)
    stop_a_save(tmp_path, drain=False)
    settle()
    assert any("Connection reset by peer" in str(error) for error in seen), seen
