"""Pulling the program out of a response, checking test-case objects, comparing outputs."""

from __future__ import annotations

import json
import re

# An opening fence tagged python / python3 / py (any case), then the code, then a closing fence at the start
# of a line. Bare ``` fences are not accepted: reasoning often puts sample input and output in bare fences,
# and the last of those is not the program; the system prompt asks for a ```python block.
_PYTHON_BLOCK = re.compile(
    r"```[ \t]*(?:python3?|py)[ \t]*\r?\n(?P<code>.*?)^[ \t]*```", re.DOTALL | re.MULTILINE | re.IGNORECASE
)


def extract_code(response: str) -> str | None:
    """The content of the LAST closed ```python (or ```py / ```python3) block, or None.

    An unclosed block (for example a generation cut off at the length limit) does not count, nor does an
    empty one.
    """
    code = None
    for match in _PYTHON_BLOCK.finditer(response):
        code = match.group("code")
    if code is None or not code.strip():
        return None
    return code


def validate_test_cases(obj: object) -> str | None:
    """None when ``obj`` is a valid PRIME ``test_cases`` object, else a short message saying what is wrong.

    Valid: ``{"inputs": [str, ...], "outputs": [str, ...]}`` with lists of equal, non-zero length, and
    optionally ``"harness": str`` (see :func:`program_for`); or call-based, ``{"fn_name": str, "inputs":
    [[arg, ...], ...], "outputs": [value, ...]}`` (see :mod:`rewards.code.calls`).
    """
    if not isinstance(obj, dict):
        return "test_cases must be an object with 'inputs' and 'outputs'"
    if "fn_name" in obj:  # call-based: rewards/code/calls.py
        from rewards.code.calls import validate_call_cases

        return validate_call_cases(obj)
    for key in ("inputs", "outputs"):
        if key not in obj:
            return f"test_cases.{key} is missing"
        value = obj[key]
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            return f"test_cases.{key} must be a list of strings"
    if len(obj["inputs"]) != len(obj["outputs"]):
        lengths = f"{len(obj['inputs'])} vs {len(obj['outputs'])}"
        return f"test_cases.inputs and test_cases.outputs differ in length ({lengths})"
    if not obj["inputs"]:
        return "test_cases must hold at least one case"
    harness = obj.get("harness")
    if harness is not None and (not isinstance(harness, str) or not harness.strip()):
        return "test_cases.harness must be a non-empty string of Python source when given"
    return None


def read_test_cases(value: object, key: str) -> dict:
    """A row's code label -> its test cases: the object, or that object as a JSON string (some PRIME exports
    store it so); ValueError says what is wrong with it."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise ValueError("test_cases is a string but not a JSON object") from None
    problem = validate_test_cases(value)
    if problem:
        raise ValueError(problem)
    return value


def program_for(code: str, test_cases: dict) -> str:
    """The program run on every case: the response's code itself or, when the row has a ``harness``, the
    harness with the code given to it as the string ``SOLUTION``.

    A harness lets a row test something other than a stdin -> stdout program (a function, a class) with the
    same stdin/stdout cases: it decides what to run and what to print, for example by ``exec``-ing
    ``SOLUTION`` and calling the function it defines. It runs in the same sandbox as any program.
    """
    if "fn_name" in test_cases:
        from rewards.code.calls import call_program

        return call_program(code, test_cases["fn_name"])
    harness = test_cases.get("harness")
    if harness is None:
        return code
    return f"SOLUTION = {code!r}\n{harness}"


def normalise_output(text: str) -> str:
    """Trailing whitespace removed from every line, trailing blank lines dropped; nothing else changes."""
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines)


def outputs_match(actual: str, expected: str) -> bool:
    return normalise_output(actual) == normalise_output(expected)
