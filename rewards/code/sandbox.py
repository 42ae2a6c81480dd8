"""Run one untrusted Python program on one stdin inside a bubblewrap sandbox.

Layers, outermost first (each run is a fresh copy of all of them):

1. ``subprocess`` starts the chain in a new session (``setsid``) as a dedicated unprivileged uid/gid with no
   supplementary groups (the switch happens in C inside ``_posixsubprocess``, so it is safe from threads).
   Every worker slot has its own uid (``uid_base + k``, claimed with a lock file so two scorers on one host
   never share one): RLIMIT_NPROC counts processes per uid, and does nothing for root.
2. ``prlimit`` (util-linux) lowers the rlimits and execs bwrap: CPU seconds (soft = hard: SIGKILL when
   reached), address space, file size, number of processes, open files, no core files. The limits are
   inherited by everything the program starts.
3. ``bwrap --unshare-all --unshare-user --disable-userns --die-with-parent --new-session --as-pid-1``: new
   user, pid, net (loopback only, no route out), ipc, uts and cgroup namespaces; a root made of an empty
   tmpfs that is remounted read-only once built; ``/usr`` bound read-only, with ``/bin``, ``/sbin`` and
   ``/lib*`` as on the host (symlinks into ``/usr`` on merged-usr systems, else read-only binds), plus the interpreter's prefix when it lives outside ``/usr``; a
   private ``/proc`` of the new pid namespace; a minimal read-only ``/dev`` with a small ``/dev/shm``; a
   private, size-capped tmpfs as ``/tmp`` and cwd; the program itself bound read-only at
   ``/code/main.py``; an empty environment apart from PATH, HOME and a UTF-8 locale. Nothing of ``/root``,
   ``/home``, ``/etc`` or the project is visible. The program is pid 1 of its pid namespace: when it exits
   the kernel kills and reaps every process left in the namespace (daemons, double forks, orphans) before
   the outer bwrap sees it exit, so nothing outlives a run and no zombie is left for the host's init
   (see :class:`_Run` for why bwrap's own reaper is not used).
4. The parent enforces a wall-clock deadline (SIGKILL to the program through a pidfd, which takes the whole
   namespace down), caps what it keeps of stdout (over the cap -> killed, "output limit exceeded") and
   stderr (the rest is read and dropped), feeds stdin without blocking, and after any kill sweeps ``/proc``
   for processes of the slot's uid until none is left.

Interpreter: ``/usr/bin/python3`` by default (a plain system Python, no access to the project's venv). A
different one may be given; when its real path is outside ``/usr`` its prefix directory is bound read-only
at the same path. It must be readable by an unprivileged uid (an interpreter under root's 0700 home, such
as pyenv's in /root, is not) and be a real installation, not a venv (a venv points outside itself).

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
import struct
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from rewards.code.uids import (KILL_WAIT_S, DEFAULT_UID_BASE, SandboxUnavailable, UidPool, kill_uid_processes,
                               proc_status)


DEFAULT_PYTHON = "/usr/bin/python3"
_CODE_PATH = "/code/main.py"
_HARNESS_PATH = "/code/harness.pyc"
_HARNESS_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "harness.py")
# rewards/code/harness.py's framing: in, a length before each case's stdin; out, a header before each result
_LENGTH = struct.Struct("<Q")
_RESULT = struct.Struct("<BiQQd")
_EXITED, _WALL_TIME, _OUTPUT_LIMIT = 0, 1, 2
_CASE_SLACK_S, _START_SLACK_S = 0.5, 5.0  # the host's own bound on a harness: each case's wall limit plus these
_TOP_LEVEL_SYSTEM_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_READ_CHUNK = 1 << 16


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits for one run of a program on one test case.

    The address-space cap applies to each process; the processes a program may own (threads count) are
    capped by ``max_processes``. 1 GiB is enough for plain Python; raise it for programs that import numpy.
    """

    cpu_time_s: int = 2  # RLIMIT_CPU, soft = hard: SIGKILL when reached (per process)
    wall_time_s: float = 4.0  # killed after this long however it spends its time (sleep, blocked reads)
    address_space_bytes: int = 1 << 30  # RLIMIT_AS per process
    max_processes: int = 16  # RLIMIT_NPROC for the sandbox uid (threads count), the outer bwrap included
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
            raise ValueError("max_processes must be at least 4 (bwrap and the program take two)")
        for name in ("address_space_bytes", "max_open_files", "max_file_bytes", "tmpfs_bytes",
                     "max_output_bytes", "max_stderr_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")


# Outcome of one run. "sandbox_error" is bwrap failing to build the sandbox (reported, never trusted).
OK, RUNTIME_ERROR, TIMEOUT, OUTPUT_LIMIT = "ok", "runtime_error", "timeout", "output_limit"
SANDBOX_ERROR = "sandbox_error"


@dataclass(frozen=True)
class RunResult:
    status: str  # one of OK, RUNTIME_ERROR, TIMEOUT, OUTPUT_LIMIT, SANDBOX_ERROR
    stdout: bytes
    stderr: bytes  # at most max_stderr_bytes
    returncode: int | None  # None when the parent killed it
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
                # both ways in: the program as the sandbox's pid 1, and cases forked by the harness
                results = [run_program(program, b"2 3\n", SandboxLimits(), uid, python),
                           *run_cases(program, [b"2 3\n", b"4 5\n"], SandboxLimits(), uid, python)]
            finally:
                pool.release(uid)
        for result, expected in zip(results, (b"5\n", b"5\n", b"9\n")):
            if result.status != OK or result.stdout != expected:
                detail = result.stderr.decode("utf-8", "replace").strip()[-500:]
                raise SandboxUnavailable(f"the sandbox does not run programs here ({result.status}): {detail}")
        _checked.add(python)


# ----------------------------------------------------------------------------------------------------------
# One run


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


def _command(prlimit: str, bwrap: str, limits: SandboxLimits, python: str, info_fd: int, cpu_s: int,
             files: Sequence[tuple[int, str]], argv: Sequence[str]) -> list[str]:
    """prlimit + bwrap + ``python -I argv``, with each (fd, path) of ``files`` bound read-only."""
    def both(n: int) -> str:
        return f"{n}:{n}"

    binds = [arg for fd, path in files for arg in ("--ro-bind-data", str(fd), path)]
    return [
        prlimit,
        f"--cpu={both(cpu_s)}",  # soft = hard: as pid 1 the program ignores SIGXCPU
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
        *binds,
        "--remount-ro", "/",
        "--chdir", "/tmp",
        python, "-I", *argv,
    ]  # fmt: skip


def _memfd(name: str, content: str | bytes) -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    data = memoryview(content if isinstance(content, bytes) else content.encode("utf-8", "surrogatepass"))
    while data:
        data = data[os.write(fd, data) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _start(files: Sequence[tuple[str | bytes, str]], argv: Sequence[str], cpu_s: int, limits: SandboxLimits, uid: int,
           python: str) -> _Run:
    """A sandbox running ``python -I argv`` as ``uid``, each (content, path) of ``files`` bound read-only."""
    bwrap, prlimit = _require_tools()
    fds = [(_memfd(os.path.basename(path), content), path) for content, path in files]
    info_r, info_w = os.pipe2(os.O_CLOEXEC)
    try:
        proc = subprocess.Popen(
            _command(prlimit, bwrap, limits, python, info_w, cpu_s, fds, argv),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(*(fd for fd, _ in fds), info_w),
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
        for fd, _ in fds:
            os.close(fd)
        os.close(info_w)
    return _Run(proc, uid, info_r)


def run_program(
    code: str, stdin: bytes, limits: SandboxLimits, uid: int, python: str = DEFAULT_PYTHON
) -> RunResult:
    """Run ``code`` with ``stdin`` in a fresh sandbox as ``uid`` (which nothing else may be using), the program
    itself pid 1 of the sandbox.

    On return no process of the sandbox is left.
    """
    start = time.monotonic()
    run = _start([(code, _CODE_PATH)], [_CODE_PATH], limits.cpu_time_s, limits, uid, python)
    try:
        return run.supervise(stdin, limits, start)
    except BaseException:
        run.kill()
        raise
    finally:
        run.close()


# The sandbox's interpreter compiles the harness once, here, outside any sandbox (it runs no untrusted code):
# within each sandbox it would compile it again (~15 ms, a read-only /code keeps no .pyc).
_COMPILE_PYC = (
    "import importlib.util, marshal, sys\n"
    "code = compile(sys.stdin.buffer.read(), sys.argv[1], 'exec', dont_inherit=True)\n"
    "sys.stdout.buffer.write(importlib.util.MAGIC_NUMBER + bytes(12) + marshal.dumps(code))\n"
)


@functools.lru_cache(maxsize=None)
def _harness_pyc(python: str) -> bytes:
    """rewards/code/harness.py compiled by ``python`` (the sandbox's interpreter) into a .pyc file's bytes."""
    with open(_HARNESS_SOURCE, "rb") as handle:
        source = handle.read()
    done = subprocess.run([python, "-I", "-c", _COMPILE_PYC, _HARNESS_PATH], input=source, capture_output=True,
                          env={}, timeout=60)
    if done.returncode != 0:
        raise SandboxUnavailable(f"the sandbox interpreter {python!r} cannot compile the case harness: "
                                 f"{done.stderr.decode('utf-8', 'replace').strip()[-300:]}")
    return done.stdout


def run_cases(code: str, stdins: Sequence[bytes], limits: SandboxLimits, uid: int,
              python: str = DEFAULT_PYTHON) -> Iterator[RunResult]:
    """Run ``code`` on each of ``stdins`` in one sandbox as ``uid`` (which nothing else may be using): the results,
    in order, each as soon as its case ends.

    Inside, rewards/code/harness.py forks one fresh process a case, with the limits of ``limits`` each, and
    kills whatever a case left (processes, files in /tmp) before the next starts, so a case runs as
    :func:`run_program` would run it, for the cost of a fork rather than of a sandbox and an interpreter. Two
    differences a program could notice: it is not pid 1, so a signal it sends itself kills it; and every case
    shares the interpreter's hash seed. Closing the iterator early kills the sandbox; once it is exhausted or
    closed, no process of the sandbox is left.
    """
    stdins = list(stdins)
    if not stdins:
        return
    start = time.monotonic()
    argv = [_HARNESS_PATH, repr(limits.wall_time_s), str(limits.cpu_time_s), str(limits.max_output_bytes),
            str(limits.max_stderr_bytes)]
    # the harness's own CPU is a few milliseconds a case; each case lowers its own limit to cpu_time_s
    cpu_s = limits.cpu_time_s + len(stdins)
    run = _start([(code, _CODE_PATH), (_harness_pyc(python), _HARNESS_PATH)], argv, cpu_s, limits, uid, python)
    deadline = start + len(stdins) * (limits.wall_time_s + _CASE_SLACK_S) + _START_SLACK_S
    framed = b"".join(_LENGTH.pack(len(data)) + data for data in stdins)
    frame_limit = _RESULT.size + limits.max_output_bytes + limits.max_stderr_bytes
    err, pending, done, failed = bytearray(), bytearray(), 0, None
    events = run.events(framed, deadline, err, limits.max_stderr_bytes)
    try:
        try:
            for chunk in events:
                pending += chunk
                while done < len(stdins) and (result := _take_result(pending)) is not None:
                    done += 1
                    yield result
                if len(pending) > frame_limit or (done == len(stdins) and pending):
                    failed = SANDBOX_ERROR  # not the harness's framing: never trusted
                    break
        except _WallTime:
            failed = TIMEOUT
        if failed is None:
            run.proc.wait()  # every pipe closed: it has exited
            if done == len(stdins):
                return
            # bwrap could not build the sandbox, or the harness died (its traceback is in err)
            failed = SANDBOX_ERROR
        run.kill()
        for _ in range(done, len(stdins)):
            yield RunResult(failed, b"", bytes(err), None, time.monotonic() - start)
    finally:
        events.close()
        if run.proc.returncode is None:  # closed early, or an error on the way
            run.kill()
        run.close()


def _take_result(pending: bytearray) -> RunResult | None:
    """The first whole result frame of the harness's output, removed from ``pending``; None if not all there."""
    if len(pending) < _RESULT.size:
        return None
    outcome, status, out_len, err_len, wall = _RESULT.unpack_from(pending)
    end = _RESULT.size + out_len + err_len
    if len(pending) < end:
        return None
    out = bytes(pending[_RESULT.size : _RESULT.size + out_len])
    err = bytes(pending[_RESULT.size + out_len : end])
    del pending[:end]
    if outcome == _WALL_TIME:
        return RunResult(TIMEOUT, out, err, None, wall)
    if outcome == _OUTPUT_LIMIT:
        return RunResult(OUTPUT_LIMIT, out, err, None, wall)
    if status == 0:
        return RunResult(OK, out, err, 0, wall)
    # killed by the CPU limit (SIGKILL at the hard limit, SIGXCPU at the soft one, which are equal)
    if status in (-signal.SIGKILL, -signal.SIGXCPU):
        return RunResult(TIMEOUT, out, err, status, wall)
    return RunResult(RUNTIME_ERROR, out, err, status, wall)


class _WallTime(Exception):
    """The host's deadline for a sandbox passed."""


class _Run:
    """One started sandbox: the outer bwrap (our child) and, once bwrap reports its pid, the program, which
    is pid 1 of a new pid namespace (``--as-pid-1``). The outer bwrap waits for (and reaps) the program, and
    the kernel kills and reaps every other process of a pid namespace before its pid 1 counts as exited: so
    once the outer bwrap has exited, nothing of the sandbox is left, and nothing is left for init to reap.

    Why the program is pid 1 rather than a child of bwrap's reaper: the reaper's exit is not waited for by
    the outer bwrap, so each run would leave a zombie for the host's init to reap, and zombies count against
    RLIMIT_NPROC. As pid 1 the program ignores signals it has no handler for (SIGXCPU included), which is
    why the CPU limit's soft and hard values are equal: SIGKILL at the limit.
    """

    def __init__(self, proc: subprocess.Popen, uid: int, info_fd: int):
        self.proc, self.uid, self.info_fd = proc, uid, info_fd
        self.info = bytearray()
        self.outer_fd = os.pidfd_open(proc.pid)
        self.child_fd: int | None = None  # pidfd of the program, None until known (or if unusable)

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

    def supervise(self, stdin: bytes, limits: SandboxLimits, start: float) -> RunResult:
        out, err, killed_for = bytearray(), bytearray(), None
        events = self.events(stdin, start + limits.wall_time_s, err, limits.max_stderr_bytes)
        try:
            for chunk in events:
                out += chunk
                if len(out) > limits.max_output_bytes:
                    killed_for = OUTPUT_LIMIT
                    break
        except _WallTime:
            killed_for = TIMEOUT
        finally:
            events.close()
        wall = time.monotonic() - start
        if killed_for:
            self.kill()
            return RunResult(killed_for, bytes(out[: limits.max_output_bytes]), bytes(err), None, wall)
        returncode = self.proc.wait()  # it has exited already
        return RunResult(_exit_status(returncode, err), bytes(out), bytes(err), returncode, wall)

    def events(self, stdin: bytes, deadline: float, err: bytearray, max_stderr: int) -> Iterator[bytes]:
        """Feed stdin and yield stdout as it comes, keeping up to ``max_stderr`` bytes of stderr in ``err``, until
        every pipe is closed and the outer bwrap has exited; raises _WallTime at ``deadline``."""
        proc = self.proc
        out_fd, err_fd, in_fd = proc.stdout.fileno(), proc.stderr.fileno(), proc.stdin.fileno()
        sel = selectors.DefaultSelector()
        try:
            for fd in (out_fd, err_fd, in_fd):
                os.set_blocking(fd, False)
            for fd in (out_fd, err_fd, self.info_fd, self.outer_fd):
                sel.register(fd, selectors.EVENT_READ)
            pending = memoryview(stdin)
            if pending:
                sel.register(in_fd, selectors.EVENT_WRITE)
            else:
                proc.stdin.close()
            while sel.get_map():
                timeout = deadline - time.monotonic()
                if timeout <= 0:
                    raise _WallTime()
                for key, _ in sel.select(timeout):
                    fd = key.fd
                    if fd == self.outer_fd:
                        sel.unregister(fd)
                    elif fd == in_fd:
                        pending = self._feed(sel, in_fd, pending)
                    else:
                        chunk = os.read(fd, _READ_CHUNK)
                        if not chunk:
                            sel.unregister(fd)
                            if fd == self.info_fd:
                                self._open_child()
                        elif fd == out_fd:
                            yield chunk
                        elif fd == err_fd:
                            if len(err) < max_stderr:
                                err += chunk[: max_stderr - len(err)]
                        else:
                            self.info += chunk
        finally:
            sel.close()

    def _feed(self, sel, in_fd: int, pending: memoryview) -> memoryview:
        """Write what the pipe takes now; close stdin once all is written or the program stopped reading."""
        try:
            written = os.write(in_fd, pending[:_READ_CHUNK])
            pending = pending[written:]
        except BlockingIOError:
            return pending
        except BrokenPipeError:  # it stopped reading: fine
            pending = pending[:0]
        if not pending:
            sel.unregister(in_fd)
            self.proc.stdin.close()
        return pending

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


def _exit_status(returncode: int, err: bytes) -> str:
    if returncode == 0:
        return OK
    # bwrap exits with 128 + the signal that killed the program. Nothing in the sandbox can SIGKILL its pid 1:
    # that is the CPU limit.
    if returncode == 128 + signal.SIGKILL:
        return TIMEOUT
    if returncode == 1 and err.startswith(b"bwrap: "):
        # bwrap failed to build the sandbox. A program could print this too, which only fails its own case.
        return SANDBOX_ERROR
    return RUNTIME_ERROR
