"""Call-based code rows (APPS / TACO / PRIME ``fn_name`` shape) in the sandbox: loaded from hand-written rows in the
published shape (``input_output`` a JSON string), passing with the canonical solution, failing with a wrong one."""

import json
import os

import pytest

from coati.dataset.loader import load_examples
from coati.dataset.rows import RowFormat
from rewards.code import validate_test_cases
from rewards.code.calls import returned_matches, values_equal

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "apps_call_based.jsonl")


def fenced(code):
    return f"Here is my solution.\n```python\n{code}```\n"


@pytest.fixture(scope="module")
def scorer():
    from rewards.code import CodeRewardScorer, SandboxUnavailable, check_sandbox_available

    try:
        check_sandbox_available()
    except SandboxUnavailable as err:
        pytest.skip(str(err))
    with CodeRewardScorer(max_workers=2) as s:
        yield s


@pytest.fixture(scope="module")
def rows():
    examples = load_examples(FIXTURE, RowFormat(reward_type="code", input_key="question", label_key="input_output"))
    raw = [json.loads(line) for line in open(FIXTURE)]
    return [(e, json.loads(r["solutions"])[0]) for e, r in zip(examples, raw)]


WRONG = {
    "sum_pairs": "def sum_pairs(ints, s):\n    for i, x in enumerate(ints):\n        for y in ints[i + 1:]:\n"
                 "            if x + y == s:\n                return [x, y]\n",  # first by the first element
    "stats": "def stats(xs):\n    m = sum(xs) / len(xs)\n    return (m, (sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5)\n",
    "twoSum": "class Solution:\n    def twoSum(self, nums: List[int], target: int) -> List[int]:\n"
              "        return [0, 1]\n",
    None: "a, b = map(int, input().split())\nprint(a - b)\n",
}


def test_the_canonical_solutions_pass(scorer, rows):
    results = scorer.score_batch([fenced(solution) for _, solution in rows], [e.test_cases for e, _ in rows])
    assert [(r.correct, r.reward, r.reason) for r in results] == [(True, 1.0, "ok")] * len(rows)
    assert "fn_name" not in rows[3][0].test_cases  # the stdin/stdout row of the same file


def test_wrong_solutions_fail(scorer, rows):
    responses = [fenced(WRONG[e.test_cases.get("fn_name")]) for e, _ in rows]
    results = scorer.score_batch(responses, [e.test_cases for e, _ in rows])
    assert [r.correct for r in results] == [False] * 4
    assert results[0].reason == "wrong answer on case 1 (4/5 passed)"  # [5, 5] instead of [3, 7]
    assert results[2].reason == "wrong answer on case 1 (2/3 passed)"


def test_function_missing_raising_or_printing(scorer, rows):
    example = rows[0][0]
    cases = example.test_cases
    missing = scorer.score(fenced("def other(ints, s):\n    return None\n"), cases)
    assert not missing.correct and missing.reason.startswith("runtime error on case 0")
    raises = scorer.score(fenced("def sum_pairs(ints, s):\n    raise ValueError\n"), cases)
    assert raises.reason.startswith("runtime error on case 0")
    # what the code prints does not count; a main block does not run (it would wait for stdin)
    chatty = rows[0][1] + "print('[1, 7]')\nif __name__ == '__main__':\n    input()\n"
    assert scorer.score(fenced(chatty), cases).correct
    # a top-level function wins over a Solution method of the same name
    both = rows[0][1] + "class Solution:\n    def sum_pairs(self, ints, s):\n        return None\n"
    assert scorer.score(fenced(both), cases).correct


def test_comparison_rules():
    assert values_equal((1, [2.0000001, "a"]), [1, [2, "a"]])  # tuple == list, float tolerance
    assert not values_equal(1.01, 1) and not values_equal(True, 1) and not values_equal([1], [1, 2])
    assert values_equal({"a": [1.0]}, {"a": [1]}) and not values_equal({"a": 1}, {"b": 1})
    assert returned_matches("noise\n[1, 7]\n", [[1, 7]])  # APPS's one-element wrapping
    assert returned_matches("null\n", [None]) and not returned_matches("", [None])
    assert not returned_matches("not json\n", 3) and returned_matches("3\n", 3)
    assert values_equal(10**20, 10**20) and not values_equal(10**20, 10**20 + 1)  # ints exactly


@pytest.mark.parametrize("cases, message", [
    ({"fn_name": "f x", "inputs": [[1]], "outputs": [1]}, "fn_name must be a Python function name"),
    ({"fn_name": "f", "inputs": [1], "outputs": [1]}, "inputs must be a list of argument lists"),
    ({"fn_name": "f", "inputs": [[1]], "outputs": [1, 2]}, "differ in length (1 vs 2)"),
    ({"fn_name": "f", "inputs": [], "outputs": []}, "at least one case"),
    ({"fn_name": "f", "inputs": [[1]], "outputs": [1], "harness": "x"}, "cannot have both fn_name and harness"),
])
def test_bad_call_based_rows(cases, message):
    assert message in validate_test_cases(cases)
