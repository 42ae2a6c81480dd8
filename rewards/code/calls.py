"""Call-based test cases (APPS / TACO / PRIME shape): the row names a function and gives JSON arguments and results.

``{"fn_name": "add", "inputs": [[1, 2], [3, 4]], "outputs": [3, 7]}``: case i calls ``add(*inputs[i])`` and
compares what it returns with ``outputs[i]``. The function is the response's top-level ``fn_name`` or, when
there is none, the method ``fn_name`` of its ``class Solution`` (LeetCode style, called on ``Solution()``).
Each case is one sandboxed run of a small driver (``call_program``): it runs the response's code as module
``solution`` (so an ``if __name__ == "__main__":`` block does not run) with ``from typing import *`` done first
(LeetCode signatures say ``List[int]``), reads the arguments as JSON from stdin, calls the function, and
writes the returned value as JSON on a copy of stdout taken before the code ran; whatever the code itself
prints goes to stderr and is ignored.

Comparison (``returned_matches``): JSON values, recursively: booleans equal only booleans; other numbers equal
integers exactly, and with a float on either side within
``math.isclose(rel_tol=1e-6, abs_tol=1e-6)``, lists and tuples alike (JSON has only lists), sets as sorted
lists, dicts by key; and, as APPS's own checker does, an expected value that is a one-element list
also matches that element returned bare (APPS stores many results wrapped: ``"outputs": [[3], [7]]``).
"""

from __future__ import annotations

import json
import math
from typing import Any

_DRIVER = '''
import json, os, sys
_out = os.fdopen(os.dup(1), "w")
sys.stdout = sys.stderr
_args = json.loads(sys.stdin.read())
_ns = {"__name__": "solution"}
exec("from typing import *", _ns)
exec(compile(SOLUTION, "solution.py", "exec"), _ns)
_cls = _ns.get("Solution")
if callable(_ns.get(FN_NAME)) and not isinstance(_ns.get(FN_NAME), type):
    _fn = _ns[FN_NAME]
elif isinstance(_cls, type) and callable(getattr(_cls, FN_NAME, None)):
    _fn = getattr(_cls(), FN_NAME)
else:
    sys.exit("the response defines no function or Solution method " + FN_NAME)
_result = _fn(*_args)
def _plain(o):
    if isinstance(o, (set, frozenset)):
        try:
            return sorted(o)
        except TypeError:
            return list(o)
    return repr(o)
_out.write(json.dumps(_result, default=_plain) + "\\n")
_out.flush()
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


def values_equal(got: Any, expected: Any) -> bool:
    if isinstance(got, bool) or isinstance(expected, bool):  # JSON's true is not 1
        return isinstance(got, bool) and isinstance(expected, bool) and got == expected
    if isinstance(got, (int, float)) and isinstance(expected, (int, float)):
        if isinstance(got, int) and isinstance(expected, int):
            return got == expected
        return math.isclose(got, expected, rel_tol=1e-6, abs_tol=1e-6)
    if isinstance(got, (list, tuple)) and isinstance(expected, (list, tuple)):
        return len(got) == len(expected) and all(values_equal(a, b) for a, b in zip(got, expected))
    if isinstance(got, dict) and isinstance(expected, dict):
        return got.keys() == expected.keys() and all(values_equal(got[k], expected[k]) for k in got)
    return got == expected


def returned_matches(stdout: str, expected: Any) -> bool:
    """The driver's output (its last line, JSON) against the expected return value."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        return False
    try:
        got = json.loads(lines[-1])
    except ValueError:
        return False
    if values_equal(got, expected):
        return True
    return isinstance(expected, list) and len(expected) == 1 and values_equal(got, expected[0])
