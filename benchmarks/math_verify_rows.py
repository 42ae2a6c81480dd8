"""Agreement of the boxed math reward with math-verify's own test rows whose answer is boxed.

math-verify's test suite (not shipped in its wheel) holds ``(gold, answer, expected)`` rows under
``pytest.mark.parametrize``. This reads every such row from a checkout's ``tests/`` (as data, with ``ast``,
never importing it), keeps those whose answer holds ``\\boxed``, scores each answer against its gold with
the project's ``boxed`` reward and counts the verdicts equal to the expected one; the misses are listed.

    git clone https://github.com/huggingface/Math-Verify /tmp/Math-Verify
    .venv/bin/python benchmarks/math_verify_rows.py /tmp/Math-Verify/tests
"""

from __future__ import annotations

import argparse
import ast
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rewards.math import BOXED, GoldAnswer, score_group  # noqa: E402


def _parametrized_rows(tree: ast.AST):
    for node in ast.walk(tree):
        for decorator in getattr(node, "decorator_list", ()):
            if isinstance(decorator, ast.Call) and getattr(decorator.func, "attr", "") == "parametrize":
                try:
                    values = ast.literal_eval(decorator.args[1])
                except (ValueError, SyntaxError, IndexError):  # rows built by code, not literals
                    continue
                yield from values


def boxed_rows(tests_dir: str) -> list[tuple[str, str, str, bool]]:
    """(file, gold, answer, expected) of every literal three-field row whose answer holds a box."""
    rows = []
    for name in sorted(os.listdir(tests_dir)):
        if not (name.startswith("test_") and name.endswith(".py")):
            continue
        with open(os.path.join(tests_dir, name), encoding="utf-8") as handle:
            tree = ast.parse(handle.read())
        for row in _parametrized_rows(tree):
            if (isinstance(row, tuple) and len(row) == 3 and isinstance(row[0], str) and isinstance(row[1], str)
                    and "\\boxed" in row[1]):
                rows.append((name, row[0], row[1], bool(row[2])))
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tests_dir", help="the tests/ directory of a math-verify checkout")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.tests_dir):
        raise SystemExit(f"error: {args.tests_dir} is not a directory; give the tests/ of a math-verify checkout")
    rows = boxed_rows(args.tests_dir)
    misses = [(name, gold, answer, expected) for name, gold, answer, expected in rows
              if score_group([answer], GoldAnswer(gold), BOXED)[0].correct != expected]
    for name, gold, answer, expected in misses:
        print(f"miss ({name}, expected {expected}): gold {gold[-80:]!r} answer {answer[-120:]!r}")
    print(f"agrees with the expected verdict on {len(rows) - len(misses)} of {len(rows)} rows with a boxed answer")


if __name__ == "__main__":
    main()
