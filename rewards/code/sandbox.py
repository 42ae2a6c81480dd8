"""Run untrusted Python programs on their stdin inside a bubblewrap sandbox.

Layers, outermost first (a :class:`CaseRunner` holds one sandbox; a fresh process each case runs in):

1. ``subprocess`` starts the chain in a new session (``setsid``) as a dedicated unprivileged uid/gid with no
   supplementary groups (the switch happens in C inside ``_posixsubprocess``, so it is safe from threads).
   Every worker slot has its own uid (``uid_base + k``, claimed with a lock file so two scorers on one host
   never share one): RLIMIT_NPROC counts processes per uid, and does nothing for root.
2. ``prlimit`` (util-linux) lowers the rlimits and execs bwrap: address space, file size, number of processes,
   open files, no core files, inherited by everything inside. CPU seconds are set per case (below).
3. ``bwrap --unshare-all --unshare-user --disable-userns --die-with-parent --new-session --as-pid-1``: new
   user, pid, net (loopback only, no route out), ipc, uts and cgroup namespaces; a root made of an empty
   tmpfs that is remounted read-only once built; ``/usr`` bound read-only, with ``/bin``, ``/sbin`` and
   ``/lib*`` as on the host (symlinks into ``/usr`` on merged-usr systems, else read-only binds), plus the
   interpreter's prefix when it lives outside ``/usr``; a private ``/proc`` of the new pid namespace; a minimal
   read-only ``/dev`` with a small ``/dev/shm``; a private, size-capped tmpfs as ``/tmp`` and cwd; the harness
   bound read-only at ``/code/harness.pyc``; an empty environment apart from PATH, HOME and a UTF-8 locale.
   Nothing of ``/root``, ``/home``, ``/etc`` or the project is visible.
4. The harness (rewards/code/harness.py) is pid 1 of the namespace, not dumpable, and never reads a program or
   an input: per case it forks a child that reads its own program and stdin, sets the case's CPU limit (soft =
   hard: SIGKILL when reached) and runs the program as ``python -I /code/main.py`` would. It enforces the
   case's wall-clock limit and output caps, then kills every other process of the namespace (daemons, double
   forks, orphans) and empties ``/tmp`` and ``/dev/shm`` before the next case. When the harness exits, the
   kernel kills whatever is left in the namespace before the outer bwrap sees it exit, so nothing outlives a
   sandbox and no zombie is left for the host's init (see :class:`_Run`).
5. The host bounds each case again (its wall limit plus slack: a harness that missed it is killed, and with it
   the whole namespace, through a pidfd), never trusts output that breaks the harness's framing, and after any
   kill sweeps ``/proc`` for processes of the slot's uid until none is left.

Interpreter: ``/usr/bin/python3`` by default (a plain system Python, no access to the project's venv). A
different one may be given; when its real path is outside ``/usr`` its prefix directory is bound read-only
at the same path. It must be readable by an unprivileged uid (an interpreter under root's 0700 home, such
as pyenv's in /root, is not) and be a real installation, not a venv (a venv points outside itself), of
Python 3.9 or later (the harness uses pidfds).

Requirements: Linux, root (to switch to the sandbox uids), ``bwrap`` and ``prlimit`` on PATH
(Debian/Ubuntu: ``apt-get install -y bubblewrap``; prlimit is in util-linux). There is never a fallback to
unsandboxed execution: :func:`check_sandbox_available` raises :class:`SandboxUnavailable` instead.
"""

from __future__ import annotations

import functools
import json
import os
import selectors
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass

from rewards.code import harness  # its framing: a length before each case's program and stdin, a header a result
from rewards.code.uids import (KILL_WAIT_S, DEFAULT_UID_BASE, SandboxUnavailable, UidPool, kill_uid_processes,
                               proc_status)


DEFAULT_PYTHON = "/usr/bin/python3"
_HARNESS_PATH = "/code/harness.pyc"
# The host's own bound on a case, beyond its wall-clock limit (which the harness enforces): slack, a sandbox's
# start when the case starts one, and its frame's transfer at a rate no machine is slower than.
_CASE_SLACK_S, _START_SLACK_S, _FEED_BYTES_PER_S = 1.0, 5.0, 20e6
_TOP_LEVEL_SYSTEM_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_READ_CHUNK = 1 << 16


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits for one run of a program on one test case.

    The address-space cap applies to each process; the processes a program may own (threads count) are
    capped by ``max_processes``. 1 GiB is enough for plain Python; raise it for programs that import numpy.
    """

    cpu_time_s: int = 2  # RLIMIT_CPU of a case's process (and each it starts), soft = hard: SIGKILL when reached
    wall_time_s: float = 4.0  # killed after this long however it spends its time (sleep, blocked reads)
    address_space_bytes: int = 1 << 30  # RLIMIT_AS per process
    max_processes: int = 16  # RLIMIT_NPROC for the sandbox uid (threads count), the outer bwrap and harness included
    max_open_files: int = 64  # RLIMIT_NOFILE
    max_file_bytes: int = 16 << 20  # RLIMIT_FSIZE: largest file the program may write (in its tmpfs)
    tmpfs_bytes: int = 32 << 20  # size of the private /tmp (and, separately, of /dev/shm)
    max_output_bytes: int = 8 << 20  # stdout beyond this kills the run: "output limit exceeded"
    max_stderr_bytes: int = 64 << 10  # stderr kept for diagnostics; the rest is read and dropped

    def __post_init__(self) -> None:
        if self.cpu_time_s < 1:
            raise ValueError("cpu_time_s must be at least 1 (RLIMIT_CPU counts whole seconds)")
        if self.wall_time_s <= 0:
            raise ValueError("wall_time_s must be positive")
        if self.max_processes < 4:
            raise ValueError("max_processes must be at least 4 (bwrap, the harness and a case take three)")
        for name in ("address_space_bytes", "max_open_files", "max_file_bytes", "tmpfs_bytes",
                     "max_output_bytes", "max_stderr_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")


# Outcome of one run. "sandbox_error": the sandbox failed (bwrap could not build it, or its harness died); no
# verdict on the program, which a caller may run again (a new sandbox starts).
OK, RUNTIME_ERROR, TIMEOUT, OUTPUT_LIMIT = "ok", "runtime_error", "timeout", "output_limit"
SANDBOX_ERROR = "sandbox_error"


@dataclass(frozen=True)
class RunResult:
    status: str  # one of OK, RUNTIME_ERROR, TIMEOUT, OUTPUT_LIMIT, SANDBOX_ERROR
    stdout: bytes
    stderr: bytes  # at most max_stderr_bytes
    returncode: int | None  # its exit code, or minus the signal that killed it; None when killed for a limit
    wall_s: float


# ----------------------------------------------------------------------------------------------------------
# Availability


def _require_tools() -> tuple[str, str]:
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable("code rewards need bubblewrap: apt-get install -y bubblewrap")
    prlimit = shutil.which("prlimit")
    if prlimit is None:
        raise SandboxUnavailable("code rewards need prlimit (util-linux): apt-get install -y util-linux")
    if os.geteuid() != 0:
        raise SandboxUnavailable(
            "code rewards must run as root: each sandboxed program is switched to its own unprivileged uid "
            "so that its process limit (RLIMIT_NPROC) holds"
        )
    return bwrap, prlimit


_checked: set[str] = set()
_checked_lock = threading.Lock()


def check_sandbox_available(python: str = DEFAULT_PYTHON) -> None:
    """Raise SandboxUnavailable unless a program can be run in the sandbox here; cheap after the first call.

    Checks the tools, root, the interpreter, then runs a tiny program in a real sandbox and checks its output.
    """
    _require_tools()
    with _checked_lock:
        if python in _checked:
            return
        if not os.path.isfile(python) or not os.access(python, os.X_OK):
            raise SandboxUnavailable(f"sandbox interpreter {python!r} not found or not executable")
        with UidPool(1, DEFAULT_UID_BASE) as pool:
            uid = pool.acquire()
            try:
                program = "print(sum(map(int, input().split())))"
                with CaseRunner(SandboxLimits(), uid, python) as runner:  # two cases: the harness goes on
                    results = [runner.run(program, b"2 3\n"), runner.run(program, b"4 5\n")]
            finally:
                pool.release(uid)
        for result, expected in zip(results, (b"5\n", b"9\n")):
            if result.status != OK or result.stdout != expected:
                detail = result.stderr.decode("utf-8", "replace").strip()[-500:]
                raise SandboxUnavailable(f"the sandbox does not run programs here ({result.status}): {detail}")
        _checked.add(python)


# ----------------------------------------------------------------------------------------------------------
# Sandboxes


@functools.lru_cache(maxsize=1)
def _system_binds() -> tuple[str, ...]:
    """/usr read-only, and /bin, /sbin, /lib* as on the host: the same symlinks into /usr on merged-usr
    systems, read-only binds where they are real directories."""
    args = ["--ro-bind", "/usr", "/usr"]
    for path in _TOP_LEVEL_SYSTEM_DIRS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    return tuple(args)


def _python_binds(python: str) -> list[str]:
    real = os.path.realpath(python)
    if real.startswith("/usr/"):
        return []
    prefix = os.path.dirname(os.path.dirname(real))  # <prefix>/bin/python3.x -> <prefix>
    if prefix in ("/", ""):
        raise SandboxUnavailable(f"cannot work out the installation prefix of {python!r}")
    return ["--ro-bind", prefix, prefix]


def _command(prlimit: str, bwrap: str, limits: SandboxLimits, python: str, info_fd: int, harness_fd: int) -> list[str]:
    def both(n: int) -> str:
        return f"{n}:{n}"

    return [
        prlimit,  # no CPU limit for the chain: the harness lives for a batch; each case sets its own
        f"--as={both(limits.address_space_bytes)}",
        f"--nproc={both(limits.max_processes)}",
        f"--nofile={both(limits.max_open_files)}",
        f"--fsize={both(limits.max_file_bytes)}",
        "--core=0:0",
        bwrap,
        "--unshare-all", "--unshare-user", "--disable-userns",
        "--die-with-parent", "--new-session", "--as-pid-1",
        "--info-fd", str(info_fd),
        "--clearenv",
        "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin",
        "--setenv", "HOME", "/tmp",
        "--setenv", "LANG", "C.UTF-8",
        *_system_binds(),
        *_python_binds(python),
        "--proc", "/proc",
        "--dev", "/dev",
        "--size", str(limits.tmpfs_bytes), "--tmpfs", "/dev/shm",
        "--remount-ro", "/dev",
        "--size", str(limits.tmpfs_bytes), "--tmpfs", "/tmp",
        "--ro-bind-data", str(harness_fd), _HARNESS_PATH,
        "--remount-ro", "/",
        "--chdir", "/tmp",
        python, "-I", _HARNESS_PATH, repr(limits.wall_time_s), str(limits.cpu_time_s),
        str(limits.max_output_bytes), str(limits.max_stderr_bytes),
    ]  # fmt: skip


# The sandbox's interpreter compiles the harness once, here, outside any sandbox (it runs no untrusted code):
# within each sandbox it would compile it again (~15 ms: a read-only /code keeps no .pyc).
_COMPILE_PYC = (
    "import importlib.util, marshal, sys\n"
    "code = compile(sys.stdin.buffer.read(), sys.argv[1], 'exec', dont_inherit=True)\n"
    "sys.stdout.buffer.write(importlib.util.MAGIC_NUMBER + bytes(12) + marshal.dumps(code))\n"
)


@functools.lru_cache(maxsize=None)
def _harness_pyc(python: str) -> bytes:
    """rewards/code/harness.py compiled by ``python`` (the sandbox's interpreter) into a .pyc file's bytes."""
    with open(harness.__file__, "rb") as handle:
        source = handle.read()
    done = subprocess.run([python, "-I", "-c", _COMPILE_PYC, _HARNESS_PATH], input=source, capture_output=True,
                          env={}, timeout=60)
    if done.returncode != 0:
        raise SandboxUnavailable(f"the sandbox interpreter {python!r} cannot compile the case harness: "
                                 f"{done.stderr.decode('utf-8', 'replace').strip()[-300:]}")
    return done.stdout


def _start(limits: SandboxLimits, uid: int, python: str) -> _Run:
    """A sandbox as ``uid`` whose pid 1 is the harness, waiting for its first case."""
    bwrap, prlimit = _require_tools()
    harness_fd = os.memfd_create("harness.pyc", os.MFD_CLOEXEC)
    info_r, info_w = os.pipe2(os.O_CLOEXEC)
    try:
        data = memoryview(_harness_pyc(python))
        while data:
            data = data[os.write(harness_fd, data) :]
        os.lseek(harness_fd, 0, os.SEEK_SET)
        proc = subprocess.Popen(
            _command(prlimit, bwrap, limits, python, info_w, harness_fd),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(harness_fd, info_w),
            start_new_session=True,
            user=uid,
            group=uid,
            extra_groups=[],
            env={},
            cwd="/",
        )
    except BaseException:
        os.close(info_r)
        raise
    finally:
        os.close(harness_fd)
        os.close(info_w)
    return _Run(proc, uid, info_r)


class CaseRunner:
    """A sandbox that runs (program, stdin) cases one after another, each in a fresh process that its harness
    (rewards/code/harness.py, the sandbox's pid 1) forks, killing whatever a case left and emptying its /tmp
    before the next: a case costs a fork, not a sandbox and an interpreter.

    Open one for a stretch of work on one uid (which nothing else may be using), :meth:`run` any number of
    cases, then :meth:`close` it (or use it as a context manager); once closed, no process of the sandbox is
    left. The sandbox starts at the first run. When it fails (it could not start, its harness died, the host's
    own deadline for a case passed), that run's result says so and the next run starts a new one.
    """

    def __init__(self, limits: SandboxLimits, uid: int, python: str = DEFAULT_PYTHON):
        self.limits, self.uid, self.python = limits, uid, python
        self._run: _Run | None = None
        self._out = bytearray()  # the harness's output not yet parsed
        self._err = bytearray()  # what the chain wrote to stderr (bwrap's or the harness's own failures)

    def run(self, code: str, stdin: bytes) -> RunResult:
        """``code`` run on ``stdin`` as ``python -I /code/main.py`` would run it, in this sandbox."""
        start = time.monotonic()
        bound = self.limits.wall_time_s + _CASE_SLACK_S
        if self._run is None:
            self._run = _start(self.limits, self.uid, self.python)
            self._out.clear()
            self._err.clear()
            bound += _START_SLACK_S
        source = code.encode("utf-8", "surrogatepass")
        frame = harness.LENGTH.pack(len(source)) + source + harness.LENGTH.pack(len(stdin)) + stdin
        bound += len(frame) / _FEED_BYTES_PER_S
        try:
            result = self._run.exchange(frame, start + bound, self._out, self._err, self.limits)
        except _WallTime:
            result = RunResult(TIMEOUT, b"", bytes(self._err), None, time.monotonic() - start)
            self._reset()  # the harness itself missed the case's limit: a new sandbox for the next case
        if result is None:  # its output ended or broke the framing: bwrap failed, or the harness died
            result = RunResult(SANDBOX_ERROR, b"", bytes(self._err), None, time.monotonic() - start)
            self._reset()
        return result

    def close(self) -> None:
        """End the sandbox: its harness exits at the end of its input; killed if it does not at once."""
        run, self._run = self._run, None
        if run is None:
            return
        try:
            run.proc.stdin.close()
            run.proc.wait(timeout=KILL_WAIT_S)  # the harness exits, and its namespace with it
        except (OSError, subprocess.TimeoutExpired):
            run.kill()
        finally:
            run.close()

    def _reset(self) -> None:
        run, self._run = self._run, None
        if run is not None:
            run.kill()
            run.close()

    def __enter__(self) -> CaseRunner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _take_result(pending: bytearray) -> RunResult | None:
    """The first whole result frame of the harness's output, removed from ``pending``; None if not all there."""
    if len(pending) < harness.HEADER.size:
        return None
    outcome, status, out_len, err_len, wall = harness.HEADER.unpack_from(pending)
    end = harness.HEADER.size + out_len + err_len
    if len(pending) < end:
        return None
    out = bytes(pending[harness.HEADER.size : harness.HEADER.size + out_len])
    err = bytes(pending[harness.HEADER.size + out_len : end])
    del pending[:end]
    if outcome == harness.WALL_TIME:
        return RunResult(TIMEOUT, out, err, None, wall)
    if outcome == harness.OUTPUT_LIMIT:
        return RunResult(OUTPUT_LIMIT, out, err, None, wall)
    if status == 0:
        return RunResult(OK, out, err, 0, wall)
    # the CPU limit: SIGKILL at the hard limit, SIGXCPU at the soft one (they are equal)
    if status in (-signal.SIGKILL, -signal.SIGXCPU):
        return RunResult(TIMEOUT, out, err, status, wall)
    return RunResult(RUNTIME_ERROR, out, err, status, wall)


class _WallTime(Exception):
    """The host's deadline for a case passed."""


class _Run:
    """One started sandbox: the outer bwrap (our child) and, once bwrap reports its pid, the harness, which is
    pid 1 of a new pid namespace (``--as-pid-1``). The outer bwrap waits for (and reaps) the harness, and the
    kernel kills and reaps every other process of a pid namespace before its pid 1 counts as exited: so once
    the outer bwrap has exited, nothing of the sandbox is left, and nothing is left for init to reap.

    Why the harness is pid 1 rather than a child of bwrap's reaper: the reaper's exit is not waited for by the
    outer bwrap, so each sandbox would leave a zombie for the host's init to reap, and zombies count against
    RLIMIT_NPROC; and as init it can kill every other process of the namespace with one ``kill(-1)`` and is
    immune to the signals the cases send it.
    """

    def __init__(self, proc: subprocess.Popen, uid: int, info_fd: int):
        self.proc, self.uid, self.info_fd = proc, uid, info_fd
        self.info = bytearray()
        self.outer_fd = os.pidfd_open(proc.pid)
        self.child_fd: int | None = None  # pidfd of the harness, None until known (or if unusable)
        for pipe in (proc.stdout, proc.stderr, proc.stdin):
            os.set_blocking(pipe.fileno(), False)
        self.open_fds = {proc.stdout.fileno(), proc.stderr.fileno(), info_fd, self.outer_fd}

    def _open_child(self) -> None:
        try:
            pid = int(json.loads(self.info)["child-pid"])
        except (ValueError, KeyError, TypeError):  # bwrap failed before starting it
            return
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:  # already gone
            return
        status = proc_status(str(pid))
        if status is None or str(self.uid) not in status.get("Uid", "").split()[:2]:
            os.close(fd)  # gone, and the pid reused by a process that is not ours
            return
        self.child_fd = fd

    def exchange(self, frame: bytes, deadline: float, out: bytearray, err: bytearray,
                 limits: SandboxLimits) -> RunResult | None:
        """Send one case's frame and read the harness's output into ``out`` until it holds one whole result:
        that result; None when the output ends first or breaks the framing. Raises _WallTime at ``deadline``."""
        proc = self.proc
        out_fd, err_fd, in_fd = proc.stdout.fileno(), proc.stderr.fileno(), proc.stdin.fileno()
        frame_limit = harness.HEADER.size + limits.max_output_bytes + limits.max_stderr_bytes
        pending = memoryview(frame)
        sel = selectors.DefaultSelector()
        try:
            for fd in self.open_fds:
                sel.register(fd, selectors.EVENT_READ)
            if not proc.stdin.closed:
                sel.register(in_fd, selectors.EVENT_WRITE)
            while True:
                result = _take_result(out)
                if result is not None:
                    return result
                if len(out) > frame_limit or out_fd not in self.open_fds:
                    return None  # not the harness's framing (never trusted), or the harness is gone
                timeout = deadline - time.monotonic()
                if timeout <= 0:
                    raise _WallTime()
                for key, _ in sel.select(timeout):
                    fd = key.fd
                    if fd == in_fd:
                        try:
                            pending = pending[os.write(in_fd, pending[:_READ_CHUNK]) :]
                        except BlockingIOError:
                            continue
                        except BrokenPipeError:  # the harness is gone: its output will end
                            pending = pending[:0]
                        if not pending:
                            sel.unregister(in_fd)
                    elif fd == self.outer_fd:
                        sel.unregister(fd)
                        self.open_fds.discard(fd)
                    else:
                        chunk = os.read(fd, _READ_CHUNK)
                        if not chunk:
                            sel.unregister(fd)
                            self.open_fds.discard(fd)
                            if fd == self.info_fd:
                                self._open_child()
                        elif fd == out_fd:
                            out += chunk
                        elif fd == err_fd:
                            if len(err) < limits.max_stderr_bytes:
                                err += chunk[: limits.max_stderr_bytes - len(err)]
                        else:
                            self.info += chunk
        finally:
            sel.close()

    def kill(self) -> None:
        """Kill the whole sandbox and reap it; on return no process of the uid is left."""
        if self.proc.returncode is None and self.child_fd is not None:
            # SIGKILL from outside reaches a namespace's pid 1; the outer bwrap then reaps it and exits
            try:
                signal.pidfd_send_signal(self.child_fd, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc.returncode is None:
            try:
                self.proc.wait(timeout=KILL_WAIT_S if self.child_fd is not None else 0.05)
            except subprocess.TimeoutExpired:  # not started yet, or stuck: --die-with-parent takes the inside along
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait()
        kill_uid_processes(self.uid)

    def close(self) -> None:
        for fd in (self.info_fd, self.outer_fd, self.child_fd):
            if fd is not None:
                os.close(fd)
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                pipe.close()
            except OSError:
                pass
