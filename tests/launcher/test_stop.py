"""The driver's stop on SIGINT/SIGTERM (coati/launcher/stop.py), with real signals sent to this process, and where
a terminal's Ctrl-C lands in a real local Ray cluster. The runs that stop are in tests/e2e/test_interrupts.py."""

from __future__ import annotations

import os
import signal
import time

import pytest

from coati.launcher.stop import RunInterrupted, StopRequest, resume_command


class Exited(BaseException):
    def __init__(self, code: int):
        self.code = code


def exit_for_test(code: int):
    raise Exited(code)


def send(signum: int) -> None:
    """Deliver ``signum`` to this process; Python runs the handler at the next bytecode boundary."""
    os.kill(os.getpid(), signum)
    time.sleep(0.05)


def make_checkpoint(run_dir, step: int) -> str:
    path = run_dir / f"step_{step}"
    path.mkdir(parents=True)
    (path / "checkpoint_complete.json").write_text("{}")
    return str(path)


def test_handlers_are_put_back_as_they_were(tmp_path):
    mine = lambda *_: None  # noqa: E731 - a program's own SIGTERM handler
    before_int = signal.getsignal(signal.SIGINT)
    before_term = signal.signal(signal.SIGTERM, mine)
    try:
        with StopRequest(str(tmp_path)) as stop:
            assert signal.getsignal(signal.SIGINT) == stop._handle
            assert signal.getsignal(signal.SIGTERM) == stop._handle
        assert signal.getsignal(signal.SIGINT) is before_int
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, before_term)


def test_reclaim_takes_the_signal_back_and_restores_the_newer_handler(tmp_path):
    """ray.init sets its own SIGTERM handler inside the run: the run takes SIGTERM back, and leaves Ray's."""
    before_term = signal.getsignal(signal.SIGTERM)
    rays = lambda *_: None  # noqa: E731
    try:
        with StopRequest(str(tmp_path)) as stop:
            signal.signal(signal.SIGTERM, rays)
            stop.reclaim()
            assert signal.getsignal(signal.SIGTERM) == stop._handle
            stop.deferred = True
            send(signal.SIGTERM)
            assert stop.requested == signal.SIGTERM
        assert signal.getsignal(signal.SIGTERM) is rays
    finally:
        signal.signal(signal.SIGTERM, before_term)


def test_before_training_a_signal_interrupts_at_once(tmp_path):
    with StopRequest(str(tmp_path)) as stop:
        with pytest.raises(KeyboardInterrupt):
            send(signal.SIGINT)
            time.sleep(5)  # a long wait (a model loading) is cut short
        assert stop.requested == signal.SIGINT
        err = stop.interrupted()
    assert err.exit_code == 130 and err.checkpoint is None
    assert str(err) == "SIGINT: stopped before any step was trained; no checkpoint to continue from: start the run again"


def test_in_the_loop_a_signal_waits_for_the_step_boundary(tmp_path):
    run_dir = tmp_path / "runs" / "my run"
    with StopRequest(str(run_dir)) as stop:
        stop.deferred = True
        send(signal.SIGTERM)  # no exception: the step under way goes on
        assert stop.requested == signal.SIGTERM
        path = make_checkpoint(run_dir, 7)
        err = stop.interrupted(7, path)
    assert err.exit_code == 143
    runs = tmp_path / "runs"
    assert err.line("rl_example.py") == (f"SIGTERM: stopped after step 7, saved {path}; continue with: python "
                                         f"rl_example.py -sd {runs} -p 'my run' --resume latest")
    assert str(err) == err.line("coati train")


@pytest.mark.parametrize("second, code, steps", [(signal.SIGTERM, 143, [3, 12]), (signal.SIGINT, 130, [])],
                         ids=["then-sigterm", "ctrl-c-twice"])
def test_a_second_signal_exits_at_once_naming_the_newest_checkpoint(tmp_path, capsys, second, code, steps):
    paths = [make_checkpoint(tmp_path, step) for step in steps]
    with StopRequest(str(tmp_path)) as stop:
        stop.deferred = True
        stop._exit = exit_for_test
        send(signal.SIGINT)
        with pytest.raises(Exited) as exited:
            send(second)
    assert exited.value.code == code
    line = capsys.readouterr().err.strip()
    assert line.startswith(f"{second.name}, a second signal: exiting now; no checkpoint was written for the steps "
                           "since the newest one (") and "\n" not in line
    assert line.endswith(f"(the newest is {paths[-1]})" if paths else "(there is none)")


def test_resumed_run_stopped_before_a_step_names_its_checkpoint(tmp_path):
    newest = make_checkpoint(tmp_path / "demo", 5)
    err = RunInterrupted(signal.SIGINT, str(tmp_path / "demo"), None, None)
    assert newest in str(err) and str(err).endswith(f"coati train -sd {tmp_path} -p demo --resume latest")
    assert err.line(resume="coati rlhf --config rlhf.yaml --resume").endswith(
        "continue with: coati rlhf --config rlhf.yaml --resume")


def test_resume_command_forms():
    assert resume_command("runs/demo") == "coati train -sd runs -p demo --resume latest"
    assert resume_command("demo", "coati ppo") == "coati ppo -sd . -p demo --resume latest"


def _blocked(pid: int, signum: int) -> bool:
    with open(f"/proc/{pid}/status") as handle:
        mask = next(int(line.split()[1], 16) for line in handle if line.startswith("SigBlk:"))
    return bool(mask & (1 << (signum - 1)))


def _rays_own(process) -> bool:
    """A process Ray started: its GCS and raylet, a named ray:: process, or a Python one run from Ray's package
    (dashboard agent, log monitor). The pytest worker may also hold children of earlier tests in its process group
    (an in-process vLLM engine's EngineCore), which are not Ray's and not what this test is about."""
    name = process.name()
    if name in ("raylet", "gcs_server") or name.startswith("ray::"):
        return True
    return any(f"{os.sep}ray{os.sep}" in part for part in process.cmdline())


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc")
def test_a_terminals_ctrl_c_reaches_no_actor(local_ray):
    """A terminal sends Ctrl-C's SIGINT to its foreground process group: the driver's. Ray starts its own
    processes there (GCS, raylet, agents) with SIGINT blocked, and every worker in a process group of its own, so
    only the driver sees it; the actors need no handler of their own."""
    import psutil
    import ray

    @ray.remote(num_cpus=0)
    class Probe:
        def pid(self) -> int:
            return os.getpid()

    actor_pid = ray.get(Probe.remote().pid.remote())
    assert os.getpgid(actor_pid) != os.getpgrp()
    blocked = {}
    for child in psutil.Process().children(recursive=True):
        try:  # a child of an earlier test may exit while it is read
            if child.pid != actor_pid and os.getpgid(child.pid) == os.getpgrp() and _rays_own(child):
                blocked[child.name()] = blocked.get(child.name(), True) and _blocked(child.pid, signal.SIGINT)
        except (psutil.NoSuchProcess, ProcessLookupError, FileNotFoundError):
            continue
    assert {"raylet", "gcs_server"} <= set(blocked), blocked
    assert all(blocked.values()), blocked
