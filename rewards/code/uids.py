"""The sandbox's unprivileged uids: a pool of free uids claimed with lock files (two scorers on one host never
share one, and RLIMIT_NPROC counts per uid), and the sweep that kills every process of a uid after a run."""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import tempfile
import threading
import time

logger = logging.getLogger(__name__)

DEFAULT_UID_BASE = 1_900_000_000
_UID_SLOTS = 4096  # uids uid_base .. uid_base + _UID_SLOTS - 1 may be claimed
_LOCK_DIR = os.path.join(tempfile.gettempdir(), "coati-code-sandbox")
KILL_WAIT_S = 5.0


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot run here; code rewards refuse to run programs without it."""


class UidPool:
    """Claims ``n`` free uids from ``uid_base`` upwards with lock files; the locks die with the process."""

    def __init__(self, n: int, uid_base: int = DEFAULT_UID_BASE):
        os.makedirs(_LOCK_DIR, mode=0o700, exist_ok=True)
        self._fds: dict[int, int] = {}
        self._free: list[int] = []
        self._cond = threading.Condition()
        for uid in range(uid_base, uid_base + _UID_SLOTS):
            if len(self._fds) == n:
                break
            fd = os.open(os.path.join(_LOCK_DIR, f"uid-{uid}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self._fds[uid] = fd
            kill_uid_processes(uid)  # whatever a crashed previous holder left behind
            self._free.append(uid)
        if len(self._fds) < n:
            self.close()
            raise SandboxUnavailable(f"could not claim {n} sandbox uids from {uid_base}")

    def acquire(self) -> int:
        with self._cond:
            while not self._free:
                self._cond.wait()
            return self._free.pop()

    def release(self, uid: int) -> None:
        with self._cond:
            self._free.append(uid)
            self._cond.notify()

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self._free.clear()

    def __enter__(self) -> UidPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def proc_status(pid: str) -> dict[str, str] | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
    except OSError:  # gone meanwhile
        return None


def uid_processes(uid: int) -> list[int]:
    """Live (non-zombie) processes whose real or effective uid is ``uid``, found by scanning /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        status = proc_status(entry)
        if status is None or status.get("State", "").startswith("Z"):
            continue
        uids = status.get("Uid", "").split()
        if len(uids) >= 2 and str(uid) in uids[:2]:
            found.append(int(entry))
    return found


def kill_uid_processes(uid: int, wait_s: float = KILL_WAIT_S) -> bool:
    """SIGKILL every process of ``uid`` until none is left; False if some survived ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        pids = uid_processes(uid)
        if not pids:
            return True
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            logger.error("sandbox uid %d still has processes %s after SIGKILL", uid, pids)
            return False
        time.sleep(0.005)
