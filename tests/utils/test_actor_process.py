"""An actor process's start: a SystemExit that lands in a ``__del__`` (Ray's SIGTERM handler at the end of a
worker) prints nothing; any other exception there is still reported. Run in a fresh interpreter, as a worker is."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import os, signal, time
from coati.utils.actor_process import start_actor_process
{start}
signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(SystemExit(1)))  # as Ray's handler does

class Handle:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)  # arrives while the finalizer runs
        time.sleep(0.1)

class Broken:
    def __del__(self):
        raise ValueError("a real bug in a finalizer")

Handle()
Broken()
print("still running")
"""


def run(start: bool) -> str:
    code = SCRIPT.format(start="start_actor_process()" if start else "")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "still running" in done.stdout, done.stderr
    return done.stderr


def test_sigterm_exit_in_a_finalizer_is_quiet_and_other_finalizer_errors_are_not():
    stderr = run(start=True)
    assert "SystemExit" not in stderr
    assert "ValueError: a real bug in a finalizer" in stderr


def test_without_it_python_prints_the_exit_traceback():
    assert "SystemExit" in run(start=False)
