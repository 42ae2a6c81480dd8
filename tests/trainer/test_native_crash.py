"""A native crash on a library's thread leaves every thread's Python stack in the worker's log, and the
trainer-group tests' crash detector finds that log (a fault injected with ctypes)."""

from __future__ import annotations

import pytest
import ray

from tests.trainer.native_crash import CrashingActor, fatal_signal_logs


def crash_a_worker() -> None:
    actor = ray.remote(CrashingActor).options(num_cpus=0, max_restarts=0).remote()
    ray.get(actor.gather_weights_while_a_thread_crashes.remote(), timeout=120)


def test_segfault_on_another_thread_names_the_main_threads_call(local_ray):
    before = fatal_signal_logs()
    with pytest.raises(ray.exceptions.RayActorError):
        crash_a_worker()
    new = {path: text for path, text in fatal_signal_logs().items() if path not in before}
    assert len(new) == 1, new.keys()
    text = next(iter(new.values()))
    assert "Fatal Python error: Segmentation fault" in text
    assert "gather_weights_while_a_thread_crashes" in text  # the main thread's frame, not only the crashing one


def test_train_runs_once_more_after_a_native_crash_and_only_then(local_ray, monkeypatch):
    from tests.trainer import test_trainer_group

    calls = []

    def crash_then_succeed(*args):
        calls.append(args)
        if len(calls) == 1:
            crash_a_worker()
        return "trained"

    monkeypatch.setattr(test_trainer_group, "train_once", crash_then_succeed)
    with pytest.warns(UserWarning, match="crashed natively"):
        assert test_trainer_group.train("model", ["-t", "2"], [], 2) == "trained"
    assert len(calls) == 2

    calls.clear()
    monkeypatch.setattr(test_trainer_group, "train_once", lambda *args: calls.append(args) or crash_a_worker())
    with pytest.warns(UserWarning), pytest.raises(ray.exceptions.RayActorError):
        test_trainer_group.train("model", ["-t", "2"], [], 2)  # a second crash fails
    assert len(calls) == 2

    def fails_in_python(*args):
        calls.append(args)
        ray.get(ray.remote(lambda: 1 / 0).remote())

    calls.clear()
    monkeypatch.setattr(test_trainer_group, "train_once", fails_in_python)
    with pytest.raises(ray.exceptions.RayTaskError):
        test_trainer_group.train("model", ["-t", "2"], [], 2)  # an ordinary failure is not retried
    assert len(calls) == 1
