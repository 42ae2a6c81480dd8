"""The built-in ``python`` tool: runs the model's code in the code rewards' bubblewrap sandbox.

Each call is a fresh process in the tool's sandbox (no network, read-only system, private size-capped /tmp, its
own unprivileged uid, CPU/memory/process/file limits, a wall-clock deadline; see ``rewards.code.sandbox``), and
nothing of a call (processes, files) reaches the next: the sandbox's harness clears them between calls. The
sandbox itself stays for the next call (a call costs a fork, not a sandbox) and ends with ``close`` or with the
process. Whatever the code does, the model gets text back: its stdout (and the tail of stderr on an error), cut
to ``max_output_chars``; a timeout or a limit is an error observation, never an exception.
"""

from __future__ import annotations

from dataclasses import dataclass

from coati.rollout.tools import ToolResult
from rewards.code.sandbox import OK, TIMEOUT, CaseRunner, SandboxLimits, check_sandbox_available
from rewards.code.uids import UidPool


@dataclass(frozen=True)
class PythonToolOptions:
    cpu_time_s: int = 2
    wall_time_s: float = 4.0
    max_output_chars: int = 1000
    workers: int = 1  # uids claimed: concurrent calls this process may make


def make_python_tool(options: PythonToolOptions = PythonToolOptions(), interpreter: str = "/usr/bin/python3"):
    """A ``python(code)`` tool function bound to its own sandbox uids; raises SandboxUnavailable at once
    (before any rollout) when the sandbox cannot run here."""
    check_sandbox_available(interpreter)
    limits = SandboxLimits(cpu_time_s=options.cpu_time_s, wall_time_s=options.wall_time_s)
    pool = UidPool(options.workers)
    runners: dict[int, CaseRunner] = {}  # a sandbox per uid, used by one call at a time (the uid's holder)

    def python(code: str) -> ToolResult:  # the function's name is the tool's name the model calls
        """Run a Python 3 program and return what it prints. No network, no files outside /tmp, a few seconds.

        Args:
            code: the whole program; use print() to see values.
        """
        uid = pool.acquire()
        try:
            runner = runners.get(uid) or runners.setdefault(uid, CaseRunner(limits, uid, interpreter))
            result = runner.run(code, b"")
        finally:
            pool.release(uid)
        return _observation(result, options.max_output_chars)

    def close() -> None:
        for runner in runners.values():
            runner.close()
        pool.close()

    python.close = close
    return python


def _observation(result, max_chars: int) -> ToolResult:
    out = result.stdout.decode("utf-8", "replace")
    if result.status == OK:
        return ToolResult(_cut(out, max_chars))
    err = result.stderr.decode("utf-8", "replace").strip().splitlines()
    detail = err[-1] if err else result.status
    if result.status == TIMEOUT:
        return ToolResult(_cut(out + f"error: timed out after {result.wall_s:.1f}s", max_chars), error=True,
                          timeout=True)
    return ToolResult(_cut(out + f"error: {detail}", max_chars), error=True)


def _cut(text: str, max_chars: int) -> str:
    return text if len(text) <= max_chars else text[:max_chars] + "...(cut)"
