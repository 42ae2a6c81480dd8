"""Telling a native crash of a Ray worker from a test failure, for the trainer-group tests' one retry.

A rare native crash (SIGSEGV inside malloc on a gloo or Ray thread of an FSDP2 rank gathering full weights)
does not reproduce on a rerun, so a rerun tells it from a wrong result, and the warning keeps it visible.
Ray reports such a death as an ActorDiedError identical to an ``os._exit`` or an OOM kill, so the evidence is
read where it is written: the dead worker's log, where coati.utils.actor_process has faulthandler dump every
thread.
"""

from __future__ import annotations

import glob
import os

FATAL_SIGNALS = ("Fatal Python error: Segmentation fault", "Fatal Python error: Bus error")


def fatal_signal_logs() -> dict[str, str]:
    """This Ray session's worker logs (path -> text) that record a fatal signal."""
    import ray

    logs_dir = ray._private.worker._global_node.get_logs_dir_path()
    found = {}
    for path in glob.glob(os.path.join(logs_dir, "worker-*.err")):
        with open(path, errors="replace") as handle:
            text = handle.read()
        if any(signal in text for signal in FATAL_SIGNALS):
            found[path] = text
    return found


class CrashingActor:
    """Fault injection for tests/trainer/test_native_crash.py (here: Ray workers import it by name)."""

    def __init__(self):
        from coati.utils.actor_process import start_actor_process

        start_actor_process()

    def gather_weights_while_a_thread_crashes(self) -> None:
        import ctypes
        import threading
        import time

        threading.Thread(target=ctypes.string_at, args=(0,), name="native-worker").start()
        time.sleep(60)  # the main thread is here when the other thread dies
