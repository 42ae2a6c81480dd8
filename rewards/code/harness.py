"""The inside of a code sandbox (rewards/code/sandbox.py ``CaseRunner``): runs (program, stdin) cases one after
another, a fresh process each.

This file is not imported by the project: compiled by the sandbox's own interpreter, it is bound read-only at
``/code/harness.pyc`` and run as pid 1 of the sandbox's pid namespace (``python -I /code/harness.pyc WALL_S CPU_S
MAX_STDOUT MAX_STDERR``). Standard library only, Python >= 3.9.

Why: starting an interpreter costs about as much as a sandbox (~20-30 ms each here), and a batch of responses
has many programs and cases. The harness starts once per batch and forks itself per case (no exec).

Each case runs as a fresh ``python -I`` run of its program would, and nothing of one case reaches another case,
the harness or the host:
- the harness never reads a program or an input: the forked child reads its own case from fd 0 (exact lengths,
  so the next case stays in the pipe), so no case's memory holds another's code or input;
- before any of the program's code runs, the child has the case's stdin (a pipe holding it, or fed by a process
  of its own when longer than a pipe holds), stdout and stderr as fds 0-2 and no other descriptor (the pipes to
  the host are closed), its own CPU limit (RLIMIT_CPU counts from the fork), and the program compiled as
  ``__main__`` of ``/code/main.py``; exit codes, uncaught exceptions, atexit and non-daemon threads behave as
  the interpreter's own;
- the harness is not dumpable: no process of the sandbox may open ``/proc/1/fd``, ``/proc/1/mem`` or trace it,
  and as the namespace's init it receives no signal from inside that it has no handler for (it installs none);
- when the case's process exits, or its wall-clock limit or output cap is hit, every other process of the
  namespace is killed and reaped (``kill(-1)`` from init), and ``/tmp`` and ``/dev/shm`` are emptied and their
  modes restored, before the next case is read.

Protocol. In (fd 0), per case: an 8-byte little-endian length and the program's source, then the same for its
stdin. Out (fd 1), per case: a header (``<BiQQd``: outcome, exit status, stdout bytes, stderr bytes, wall
seconds) and the two byte strings. Outcome 0: the process exited (status = its exit code, or minus the signal
that killed it); 1: wall time exceeded; 2: stdout over its cap (stdout is then cut at the cap). The harness
exits at the end of its input.
"""

import _signal  # not ``signal``: its enums cost ~16 ms of start-up in a sandbox, ``selectors`` ~7 ms
import atexit
import ctypes
import os
import resource
import select
import struct
import sys
import time
import types

EXITED, WALL_TIME, OUTPUT_LIMIT = 0, 1, 2
HEADER = struct.Struct("<BiQQd")
LENGTH = struct.Struct("<Q")
PR_SET_DUMPABLE = 4
WIPED = ("/tmp", "/dev/shm")
READ_CHUNK = 1 << 16


def read_exactly(fd, n):
    """``n`` bytes from ``fd`` (never more: the next case stays in the pipe), or None at the end of the input."""
    parts, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def read_frame(fd):
    length = read_exactly(fd, LENGTH.size)
    return None if length is None else read_exactly(fd, LENGTH.unpack(length)[0])


def write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


LIBC = ctypes.CDLL(None, use_errno=True)


def set_dumpable(value):
    if LIBC.prctl(PR_SET_DUMPABLE, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE)")


def kill_the_rest():
    """Kill and reap every process of the namespace but this one (its init): a case's leftovers."""
    while True:
        try:
            os.kill(-1, _signal.SIGKILL)  # from init: everything in the namespace except init itself
        except ProcessLookupError:
            pass
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def wipe(top):
    """Empty a writable directory whatever the case left in it (unreadable or deep directories included)."""
    stack = [(top, False)]
    while stack:
        path, emptied = stack.pop()
        if emptied:
            if path != top:
                os.rmdir(path)
            continue
        stack.append((path, True))
        for name in os.listdir(path):
            child = os.path.join(path, name)
            if os.path.isdir(child) and not os.path.islink(child):
                os.chmod(child, 0o700)
                stack.append((child, False))
            else:
                os.unlink(child)


def run_child(ready_w, stdout_w, stderr_w, cpu_s):
    """In the forked child: read this case from fd 0, tell the harness it did (b"R", or b"E" at the end of the
    input), then become a fresh ``python -I /code/main.py`` on fds 0-2 and exit as it would."""
    source = read_frame(0)
    data = read_frame(0) if source is not None else None
    if data is None:
        os.write(ready_w, b"E")
        os._exit(0)
    stdin_r, stdin_w = os.pipe()
    os.set_blocking(stdin_w, False)
    rest = memoryview(data)
    try:
        while rest:  # what the pipe holds goes in now
            rest = rest[os.write(stdin_w, rest):]
    except BlockingIOError:
        pass
    if rest and os.fork() == 0:  # a feeder for the rest, one of the case's own processes (killed with them)
        os.closerange(0, stdin_w)  # it keeps nothing of the harness's (the host's pipes above all)
        os.closerange(stdin_w + 1, os.sysconf("SC_OPEN_MAX"))
        os.set_blocking(stdin_w, True)
        try:
            write_all(stdin_w, rest)
        finally:
            os._exit(0)
    os.close(stdin_w)
    del rest
    del data
    os.dup2(stdin_r, 0)
    os.dup2(stdout_w, 1)
    os.dup2(stderr_w, 2)
    os.write(ready_w, b"R")
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # the host's pipes, the harness's own descriptors
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))  # soft = hard: SIGKILL at the limit
    _signal.signal(_signal.SIGINT, _signal.default_int_handler)  # as a fresh interpreter has it
    set_dumpable(1)  # its own /proc entries as usual; the harness stays closed
    try:
        code = compile(source, "/code/main.py", "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as error:  # as the interpreter reports a program that does not compile
        import traceback

        sys.stderr.write("".join(traceback.format_exception_only(type(error), error)))
        sys.stderr.flush()
        os._exit(1)
    main = types.ModuleType("__main__")
    main.__file__ = "/code/main.py"
    main.__builtins__ = __builtins__
    sys.modules["__main__"] = main
    sys.argv = ["/code/main.py"]
    status = 0
    try:
        exec(code, main.__dict__)
    except SystemExit as stop:
        status = exit_status_of(stop.code)
    except BaseException:
        kind, error, trace = sys.exc_info()
        trace = trace.tb_next  # from the program's own frames, as the interpreter would print it
        error = error.with_traceback(trace)
        if sys.excepthook is sys.__excepthook__:  # with its source lines: /code/main.py is no file here
            import linecache
            import traceback

            text = source.decode("utf-8", "replace")
            linecache.cache["/code/main.py"] = (len(text), None, text.splitlines(True), "/code/main.py")
            traceback.print_exception(kind, error, trace)
        else:
            sys.excepthook(kind, error, trace)
        status = 1
    status = finish(status)
    os._exit(status)


def exit_status_of(code):
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        sys.stderr.write(f"{code}\n")
    except Exception:
        pass
    return 1


def finish(status):
    """What the interpreter does at exit: wait for non-daemon threads, run atexit, flush (120 if it fails)."""
    threading = sys.modules.get("threading")
    if threading is not None:
        try:
            threading._shutdown()
        except BaseException:
            pass
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            if status == 0:
                status = 120
    return status


def run_case(wall_s, cpu_s, max_stdout, max_stderr):
    """Fork a child for the next case and supervise it; None at the end of the input, else (outcome, status,
    stdout, stderr, wall seconds)."""
    ready_r, ready_w = os.pipe()
    stdout_r, stdout_w = os.pipe()
    stderr_r, stderr_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            run_child(ready_w, stdout_w, stderr_w, cpu_s)
        finally:
            os._exit(1)
    for fd in (ready_w, stdout_w, stderr_w):
        os.close(fd)
    ready = os.read(ready_r, 1)  # the case is read: its clock starts
    os.close(ready_r)
    start = time.monotonic()
    if ready != b"R":
        os.waitpid(pid, 0)
        os.close(stdout_r)
        os.close(stderr_r)
        if ready == b"E":
            return None
        raise RuntimeError("a case's process failed before its program started")
    process = os.pidfd_open(pid)
    out, err = bytearray(), bytearray()
    outcome, status, exited = EXITED, 0, False
    poll = select.poll()
    reading = {stdout_r, stderr_r}
    try:
        for fd in (stdout_r, stderr_r):
            os.set_blocking(fd, False)
        for fd in (stdout_r, stderr_r, process):
            poll.register(fd, select.POLLIN)
        deadline = start + wall_s
        while not exited or reading:
            timeout = None if exited else deadline - time.monotonic()
            if timeout is not None and timeout <= 0:
                outcome = WALL_TIME
                break
            for fd, _ in poll.poll(None if timeout is None else int(timeout * 1000) + 1):
                if fd == process:
                    poll.unregister(process)
                    status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
                    exited = True
                    kill_the_rest()  # whatever it started dies with it, as with a namespace's pid 1
                elif fd in reading:
                    chunk = os.read(fd, READ_CHUNK)
                    if not chunk:
                        poll.unregister(fd)
                        reading.discard(fd)
                    elif fd == stdout_r:
                        out += chunk
                        if len(out) > max_stdout:
                            outcome = OUTPUT_LIMIT
                            del out[max_stdout:]
                            break
                    elif len(err) < max_stderr:
                        err += chunk[: max_stderr - len(err)]
            if outcome != EXITED:
                break
    finally:
        kill_the_rest()
        for fd in (stdout_r, stderr_r, process):
            os.close(fd)
    return outcome, status, bytes(out), bytes(err), time.monotonic() - start


def main():
    wall_s, cpu_s, max_stdout, max_stderr = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    set_dumpable(0)
    _signal.signal(_signal.SIGINT, _signal.SIG_DFL)  # no handler: signals from inside the namespace are dropped
    modes = {top: os.stat(top).st_mode & 0o7777 for top in WIPED}
    while True:
        result = run_case(wall_s, cpu_s, max_stdout, max_stderr)
        if result is None:
            return
        outcome, status, out, err, wall = result
        for top, mode in modes.items():  # a reset that fails ends the harness: the host fails what is left
            os.chmod(top, mode)
            wipe(top)
        write_all(1, HEADER.pack(outcome, status, len(out), len(err), wall) + out + err)


if __name__ == "__main__":
    main()
