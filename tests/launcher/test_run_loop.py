"""The one run loop (coati/launcher/run_loop.py) with a real ``StopRequest`` and real signals sent to this process:
steps, hooks in order, skipped steps, the last step, and a stop that checkpoints the last finished step. The
commands' own runs: tests/e2e/test_interrupts.py (RL, coati sft), tests/rlhf/test_stage_interrupt.py (coati rm)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from coati.launcher.run_loop import Every, Hook, RunLoop
from coati.launcher.stop import RunInterrupted, StopRequest


class Record(Hook):
    """Every call the loop makes, in order, into ``calls`` (shared by the hooks of a test)."""

    def __init__(self, name: str, calls: list):
        self.name, self.calls = name, calls

    def after_step(self, step, row):
        self.calls.append((self.name, "step", step, row["loss"]))

    def after_skip(self, step, row):
        self.calls.append((self.name, "skip", step))

    def settle(self):
        self.calls.append((self.name, "settle"))

    def close(self):
        self.calls.append((self.name, "close"))


def steps_of(rows: list, signal_at: int | None = None, signum: int = signal.SIGINT):
    """A step function over ``rows`` (None: none left); at call ``signal_at`` it signals this process mid-step, as
    Ctrl-C would, and still returns its row."""
    taken = []

    def step(done: int):
        taken.append(done)
        if len(taken) - 1 == signal_at:
            os.kill(os.getpid(), signum)
            time.sleep(0.05)  # Python runs the handler at the next bytecode boundary: here, inside the step
        return rows[len(taken) - 1] if len(taken) <= len(rows) else None

    step.taken = taken
    return step


def test_steps_go_to_the_hooks_in_order_and_end_when_no_step_is_left(tmp_path):
    calls, saved = [], []
    rows = [{"loss": 1.0}, {"loss": 0.5, "skipped": "no group survived"}, {"loss": 0.25}]
    with StopRequest(str(tmp_path)) as stop:
        with RunLoop(stop, steps_of(rows), saved.append, [Record("a", calls), Record("b", calls)]) as loop:
            assert loop.run() == 2
        assert (loop.step, loop.skipped, loop.calls) == (2, 1, 3)
    assert calls == [("a", "step", 1, 1.0), ("b", "step", 1, 1.0), ("a", "skip", 1), ("b", "skip", 1),
                     ("a", "step", 2, 0.25), ("b", "step", 2, 0.25), ("a", "close"), ("b", "close")]
    assert saved == []  # the command's end saves, not the loop


def test_a_resumed_loop_counts_on_and_stops_at_its_last_step(tmp_path):
    step = steps_of([{"loss": float(i)} for i in range(10)])
    with StopRequest(str(tmp_path)) as stop, RunLoop(stop, step, lambda at: None, []) as loop:
        assert loop.run(first=4, skipped=2, last=7) == 7
    assert step.taken == [4, 5, 6] and loop.skipped == 2


def test_sigint_mid_step_saves_that_step_settles_and_raises_one_line(tmp_path):
    calls, saved = [], []

    def checkpoint(at: int) -> str:
        saved.append(at)
        return str(tmp_path / f"step_{at}")

    step = steps_of([{"loss": float(i)} for i in range(10)], signal_at=2)
    with StopRequest(str(tmp_path)) as stop:
        with pytest.raises(RunInterrupted) as stopped:
            with RunLoop(stop, step, checkpoint, [Record("h", calls)]) as loop:
                loop.run(first=5, last=10)
    assert step.taken == [5, 6, 7]  # the step under way finished; no step after it
    assert saved == [8]
    assert calls[-3:] == [("h", "step", 8, 2.0), ("h", "settle"), ("h", "close")]
    err = stopped.value
    assert (err.exit_code, err.step, err.checkpoint) == (130, 8, str(tmp_path / "step_8"))
    assert err.line("coati sft") == (f"SIGINT: stopped after step 8, saved {tmp_path / 'step_8'}; continue with: "
                                     f"coati sft -sd {tmp_path.parent} -p {tmp_path.name} --resume latest")


def test_sigterm_in_the_only_step_call_left_still_saves_and_a_stop_before_any_step_saves_nothing(tmp_path):
    saved = []
    with StopRequest(str(tmp_path)) as stop, pytest.raises(RunInterrupted) as stopped:
        # the last step: a signal during it stops the run there (the command's end is skipped)
        RunLoop(stop, steps_of([{"loss": 1.0}], signal_at=0, signum=signal.SIGTERM), saved.append, []).run(last=1)
    assert saved == [1] and stopped.value.exit_code == 143
    saved.clear()
    with StopRequest(str(tmp_path)) as stop, pytest.raises(RunInterrupted) as stopped:
        stop.requested = signal.SIGINT  # it came before the loop's first step call
        RunLoop(stop, steps_of([{"loss": 1.0}]), saved.append, []).run(first=3)
    assert saved == [] and stopped.value.checkpoint is None and stopped.value.step == 3


def test_a_hook_that_raises_ends_the_run_with_every_hook_closed(tmp_path):
    calls = []

    def refuse(step, row):
        raise RuntimeError("weights not delivered")

    with StopRequest(str(tmp_path)) as stop, pytest.raises(RuntimeError, match="not delivered"):
        with RunLoop(stop, steps_of([{"loss": 1.0}] * 3), lambda at: None,
                     [Record("a", calls), Hook(after_step=refuse), Record("b", calls)]) as loop:
            loop.run()
    assert calls == [("a", "step", 1, 1.0), ("a", "close"), ("b", "close")]


def test_every_acts_on_multiples_below_its_bound():
    done = []
    hook = Every(3, done.append, before=9)
    for step in range(1, 11):
        hook.after_step(step, {})
    assert done == [3, 6]  # 9 is the end's
    never = Every(0, done.append)
    never.after_step(3, {})
    assert done == [3, 6]


def test_a_hook_point_that_does_not_exist_is_refused():
    with pytest.raises(TypeError, match="no point 'after_stpe'"):
        Hook(after_stpe=lambda step, row: None)
