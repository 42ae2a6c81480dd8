"""Call-based test cases (APPS / TACO / PRIME shape): the row names a function and gives JSON arguments and results.

``{"fn_name": "add", "inputs": [[1, 2], [3, 4]], "outputs": [3, 7]}``: case i calls ``add(*inputs[i])`` and
compares what it returns with ``outputs[i]``. The function is the method ``fn_name`` of the response's
``class Solution`` (LeetCode style, called on ``Solution()``) or, when it has none, its top-level ``fn_name``.

Each case is one sandboxed run of a small driver (``call_program``). The driver forks: the child runs the
response's code as module ``solution`` (registered in ``sys.modules``, so dataclasses and pickling find it; an
``if __name__ == "__main__":`` block does not run) with ``from typing import *`` done first (LeetCode
signatures say ``List[int]``), reads the arguments as JSON from stdin, calls the function and hands the
returned value, as JSON, to the driver over a pipe. The child's stdout is its stderr: whatever the code prints,
by any route, is ignored. The driver, which runs none of the response's code, is the only process holding the
run's stdout, and writes exactly one line there: the value, once the child has exited cleanly and handed over
exactly one JSON value. It makes itself undumpable first, so the child can neither ptrace it nor open its
descriptors through ``/proc``. What the child hands over is the response's to decide, as its return value is:
a program that writes a value into the pipe and exits is scored as if its function had returned that value.

Comparison (``returned_matches``): JSON values, recursively: booleans equal only booleans; an integer expected
value equals only that integer (returned as an int, or as a float with no fractional part); other numbers, with
a float expected, within ``math.isclose(rel_tol=1e-6, abs_tol=1e-6)``; lists and tuples alike (JSON has only
lists), sets as sorted lists, dicts by key; and, as APPS's own checker does, an expected value that is a
one-element list also matches that element returned bare (APPS stores many results wrapped:
``"outputs": [[3], [7]]``).
"""

from __future__ import annotations

import json
import math
from typing import Any

_DRIVER = '''
import ctypes, json, os, select, sys, traceback, types

def _call_solution(report):
    args = json.loads(sys.stdin.read())
    module = types.ModuleType("solution")
    sys.modules["solution"] = module
    namespace = module.__dict__
    exec("from typing import *", namespace)
    from_typing = dict(namespace)
    exec(compile(SOLUTION, "solution.py", "exec"), namespace)
    cls, fn = namespace.get("Solution"), namespace.get(FN_NAME)
    if isinstance(cls, type) and callable(getattr(cls, FN_NAME, None)):
        fn = getattr(cls(), FN_NAME)
    elif not callable(fn) or isinstance(fn, type) or fn is from_typing.get(FN_NAME):
        sys.exit("the response defines no function or Solution method " + FN_NAME)
    result = fn(*args)
    def plain(o):
        if isinstance(o, (set, frozenset)):
            try:
                return sorted(o)
            except TypeError:
                return list(o)
        return repr(o)
    data = json.dumps(result, default=plain).encode()
    while data:
        data = data[os.write(report, data):]
    os.close(report)

def _collect(pid, read_end):
    child, chunks = os.pidfd_open(pid), []
    while True:
        ready, _, _ = select.select([read_end, child], [], [])
        if read_end in ready:
            chunk = os.read(read_end, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
        elif child in ready:  # exited; a process it left may hold the pipe open: take what is there
            os.set_blocking(read_end, False)
            try:
                while chunk := os.read(read_end, 1 << 16):
                    chunks.append(chunk)
            except BlockingIOError:
                pass
            break
    status = os.waitpid(pid, 0)[1]
    return b"".join(chunks), status

if ctypes.CDLL(None).prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE 0: the child cannot ptrace this or open its fds
    sys.exit("the driver cannot make itself undumpable (prctl PR_SET_DUMPABLE failed)")
_read_end, _write_end = os.pipe()
_pid = os.fork()
if _pid == 0:
    os.close(_read_end)
    os.dup2(2, 1)
    try:
        _call_solution(_write_end)
    except BaseException:  # sys.exit included: the function did not return
        traceback.print_exc()
        os._exit(1)
    os._exit(0)  # what the solution left to run at exit cannot change what it handed over
else:
    os.close(_write_end)
    _report, _status = _collect(_pid, _read_end)
    if os.WIFSIGNALED(_status):  # die of it too, so the sandbox reports the CPU limit's SIGKILL as a timeout
        os.kill(os.getpid(), os.WTERMSIG(_status))
        os._exit(128 + os.WTERMSIG(_status))
    if os.waitstatus_to_exitcode(_status) != 0:
        os._exit(os.waitstatus_to_exitcode(_status))
    if not _report:
        sys.exit("the solution's process exited before its function returned")
    try:
        json.loads(_report)
    except ValueError:
        sys.exit("the solution's report is not one JSON value: it wrote into the driver's pipe")
    os.write(1, _report + b"\\n")
    os._exit(0)
'''


def is_call_based(test_cases: dict) -> bool:
    return "fn_name" in test_cases


def validate_call_cases(obj: dict) -> str | None:
    """None when ``obj`` is valid call-based test cases, else what is wrong."""
    name = obj["fn_name"]
    if not isinstance(name, str) or not name.isidentifier():
        return f"test_cases.fn_name must be a Python function name, got {name!r}"
    inputs, outputs = obj.get("inputs"), obj.get("outputs")
    if not isinstance(inputs, list) or not all(isinstance(args, list) for args in inputs):
        return "test_cases.inputs must be a list of argument lists when fn_name is given (e.g. [[1, 2], [3, 4]])"
    if not isinstance(outputs, list):
        return "test_cases.outputs must be a list of expected return values"
    if len(inputs) != len(outputs):
        return f"test_cases.inputs and test_cases.outputs differ in length ({len(inputs)} vs {len(outputs)})"
    if not inputs:
        return "test_cases must hold at least one case"
    if "harness" in obj:
        return "test_cases cannot have both fn_name and harness"
    return None


def call_program(code: str, fn_name: str) -> str:
    """The driver that calls ``fn_name`` of ``code`` with the JSON arguments on stdin (see the module doc)."""
    return f"SOLUTION = {code!r}\nFN_NAME = {fn_name!r}\n{_DRIVER}"


def call_stdin(args: list) -> str:
    return json.dumps(args)


def _numbers_equal(got: int | float, expected: int | float) -> bool:
    if isinstance(expected, int):  # an exact answer (a count, a value modulo 1e9+7): no tolerance
        return got == expected if isinstance(got, int) else got.is_integer() and int(got) == expected
    return math.isclose(got, expected, rel_tol=1e-6, abs_tol=1e-6)


def values_equal(got: Any, expected: Any) -> bool:
    if isinstance(got, bool) or isinstance(expected, bool):  # JSON's true is not 1
        return isinstance(got, bool) and isinstance(expected, bool) and got == expected
    if isinstance(got, (int, float)) and isinstance(expected, (int, float)):
        return _numbers_equal(got, expected)
    if isinstance(got, (list, tuple)) and isinstance(expected, (list, tuple)):
        return len(got) == len(expected) and all(values_equal(a, b) for a, b in zip(got, expected))
    if isinstance(got, dict) and isinstance(expected, dict):
        return got.keys() == expected.keys() and all(values_equal(got[k], expected[k]) for k in got)
    return got == expected


def returned_matches(stdout: str, expected: Any) -> bool:
    """The driver's output, exactly one line holding the returned value as JSON, against the expected value."""
    if not stdout.endswith("\n") or "\n" in stdout[:-1]:
        return False
    try:
        got = json.loads(stdout)
    except ValueError:
        return False
    if values_equal(got, expected):
        return True
    return isinstance(expected, list) and len(expected) == 1 and values_equal(got, expected[0])
