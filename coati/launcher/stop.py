"""Stopping a run on SIGINT (Ctrl-C) or SIGTERM (a scheduler's preemption, ``kill``) without losing a step.

``StopRequest`` owns the driver's handlers for both signals while a run is under way (and puts back the ones it
found when it ends: ``coati.run`` is also called inside other programs). What a signal does depends on where the
run is:
- before the training loop (cluster start, actors loading models, the first evaluation): nothing is trained, so
  there is nothing to save; the handler raises ``KeyboardInterrupt`` at once, and the run turns it into a
  ``RunInterrupted`` that says no checkpoint was written;
- in the training loop (``deferred``; run_loop.py, the one loop of ``coati train`` and ``coati sft`` / ``rm``):
  the handler only records the signal; the loop looks at ``requested`` at each step boundary, writes the same
  ``step_N`` checkpoint the periodic saves write and raises ``RunInterrupted``, whose line names the checkpoint
  and the command that continues the run;
- a second signal while a stop is under way exits at once (``os._exit``) with one line naming the newest
  checkpoint, if any: the steps since it are not saved.

Only the driver sees the signal: a terminal's Ctrl-C goes to its foreground process group, which holds the driver
and Ray's own processes (GCS, raylet, agents: Ray starts them with SIGINT blocked), while every Ray worker (the
actors) runs in a process group of its own (tests/launcher/test_stop.py checks both).

Exit statuses follow the shell's convention for a death by signal: 128 + the signal's number (130, 143).
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
import threading

from coati.cluster.supervision import RunStopped
from coati.utils.checkpoint import list_checkpoints

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def exit_status(signum: int) -> int:
    return 128 + signum


def resume_command(run_dir: str, prog: str = "coati train") -> str:
    """The command that continues the run in ``run_dir`` (``<save-dir>/<project>``) from its newest checkpoint:
    ``--resume`` restores the rest of the run's options."""
    prog = f"python {prog}" if prog.endswith(".py") else prog
    save_dir, project = os.path.split(os.path.normpath(run_dir))
    return f"{prog} -sd {shlex.quote(save_dir or '.')} -p {shlex.quote(project)} --resume latest"


class RunInterrupted(RunStopped):
    """The run stopped on a signal; ``line(prog)`` is the one line to show, ``exit_code`` the status to exit with.
    ``checkpoint``: the one this stop wrote (None: no step was trained since the newest one, ``newest``)."""

    def __init__(self, signum: int, run_dir: str, step: int | None, checkpoint: str | None):
        self.signum, self.run_dir, self.step, self.checkpoint = signum, run_dir, step, checkpoint
        self.exit_code = exit_status(signum)
        checkpoints = list_checkpoints(run_dir)
        self.newest = checkpoints[-1][1] if checkpoints else None
        super().__init__(self.line())

    def line(self, prog: str = "coati train", resume: str | None = None) -> str:
        """``resume``: the command that continues the run, when it is not ``prog`` with ``--resume latest``."""
        name = signal.Signals(self.signum).name
        resume = resume or resume_command(self.run_dir, prog)
        if self.checkpoint is not None:
            return f"{name}: stopped after step {self.step}, saved {self.checkpoint}; continue with: {resume}"
        if self.newest is None:
            return f"{name}: stopped before any step was trained; no checkpoint to continue from: start the run again"
        return (f"{name}: stopped before a step was trained; no checkpoint written (the newest is {self.newest}); "
                f"continue with: {resume}")


class StopRequest:
    """The driver's SIGINT/SIGTERM handlers for one run (a context manager; a no-op off the main thread, where
    Python cannot set handlers)."""

    def __init__(self, run_dir: str, exit=os._exit):
        self.run_dir = run_dir
        self.requested: int | None = None  # the first signal's number
        self.deferred = False  # in the training loop: a signal waits for the step boundary
        self._exit = exit  # os._exit; tests pass a function that raises
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for signum in SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def reclaim(self) -> None:
        """Take the signals back from a handler set meanwhile (``ray.init`` sets its own for SIGTERM, which would
        end the driver from inside a Ray call); that handler is the one put back at the end."""
        for signum in self._previous:
            current = signal.getsignal(signum)
            if current != self._handle:
                self._previous[signum] = current
                signal.signal(signum, self._handle)

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def interrupted(self, step: int | None = None, checkpoint: str | None = None) -> RunInterrupted:
        return RunInterrupted(self.requested, self.run_dir, step, checkpoint)

    def _handle(self, signum: int, frame) -> None:
        if self.requested is not None:  # the second: no waiting for anything
            self._exit_now(signum)
            return
        self.requested = signum
        if not self.deferred:
            raise KeyboardInterrupt  # Ray's waits pass on only this exception from a signal handler

    def _exit_now(self, signum: int) -> None:
        checkpoints = list_checkpoints(self.run_dir)
        newest = f"the newest is {checkpoints[-1][1]}" if checkpoints else "there is none"
        print(f"{signal.Signals(signum).name}, a second signal: exiting now; no checkpoint was written for the "
              f"steps since the newest one ({newest})", file=sys.stderr, flush=True)
        sys.stdout.flush()
        self._exit(exit_status(signum))
