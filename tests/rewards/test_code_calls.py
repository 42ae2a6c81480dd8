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
    # a Solution method wins over a top-level function of the same name (LeetCode rows are methods)
    method = rows[0][1].replace("(ints", "(self, ints")
    both = "class Solution:\n" + "".join(f"    {line}\n" for line in method.splitlines())
    both += "def sum_pairs(ints, s):\n    return None\n"
    assert scorer.score(fenced(both), cases).correct


def test_comparison_rules():
    assert values_equal((1, [2.0000001, "a"]), [1, [2.0, "a"]])  # tuple == list, float tolerance
    assert not values_equal(1.01, 1) and not values_equal(True, 1) and not values_equal([1], [1, 2])
    assert values_equal({"a": [1.0]}, {"a": [1]}) and not values_equal({"a": 1}, {"b": 1})
    assert returned_matches("[1, 7]\n", [[1, 7]])  # APPS's one-element wrapping
    assert returned_matches("null\n", [None]) and not returned_matches("", [None])
    assert not returned_matches("not json\n", 3) and returned_matches("3\n", 3)
    assert values_equal(10**20, 10**20) and not values_equal(10**20, 10**20 + 1)  # ints exactly


def test_an_integer_answer_is_exact():
    assert values_equal(1000000007.0, 1000000007) and values_equal(1e20, 10**20)  # an integral float is the int
    assert not values_equal(1000000006.0, 1000000007)  # within 1e-6 relative, and wrong
    assert not values_equal(2.5, 2) and not values_equal(2.0000001, 2) and not values_equal(float("nan"), 2)
    assert not values_equal(float("inf"), 2) and not values_equal([1.0, 2.5], [1, 2])
    assert values_equal(3, 3.0000001) and values_equal(2, 2.0)  # a float answer keeps its tolerance
    assert returned_matches("1000000007.0\n", 1000000007) and not returned_matches("1000000006.0\n", 1000000007)


def test_only_the_drivers_one_line_is_read():
    assert returned_matches("[1, 7]\n", [1, 7]) and not returned_matches("noise\n[1, 7]\n", [1, 7])
    assert not returned_matches("[1, 7]\n[1, 7]\n", [1, 7]) and not returned_matches("[1, 7]", [1, 7])


@pytest.mark.parametrize("cases, message", [
    ({"fn_name": "f x", "inputs": [[1]], "outputs": [1]}, "fn_name must be a Python function name"),
    ({"fn_name": "f", "inputs": [1], "outputs": [1]}, "inputs must be a list of argument lists"),
    ({"fn_name": "f", "inputs": [[1]], "outputs": [1, 2]}, "differ in length (1 vs 2)"),
    ({"fn_name": "f", "inputs": [], "outputs": []}, "at least one case"),
    ({"fn_name": "f", "inputs": [[1]], "outputs": [1], "harness": "x"}, "cannot have both fn_name and harness"),
])
def test_bad_call_based_rows(cases, message):
    assert message in validate_test_cases(cases)


# Right answers each driver shape must accept: (why, fn_name, code, inputs, outputs)
RIGHT = [
    ("a dataclass under postponed annotations (it looks its module up in sys.modules)", "manhattan",
     "from __future__ import annotations\nfrom dataclasses import dataclass\n\n@dataclass\nclass Point:\n"
     "    x: int\n    y: int\n\ndef manhattan(a, b):\n    p, q = Point(*a), Point(*b)\n"
     "    return abs(p.x - q.x) + abs(p.y - q.y)\n", [[[0, 0], [3, 4]], [[1, 1], [1, 1]]], [7, 0]),
    ("prints to sys.__stdout__ (flushed at exit, after the driver's line)", "add",
     "import sys\n\ndef add(a, b):\n    print('adding', a, b, file=sys.__stdout__)\n    return a + b\n",
     [[1, 2], [3, 4]], [3, 7]),
    ("writes to file descriptor 1 and registers an exit hook that prints", "add",
     "import atexit, os\natexit.register(print, 'bye')\n\ndef add(a, b):\n    os.write(1, b'0\\n')\n    return a + b\n",
     [[1, 2]], [3]),
    ("a Solution method named like a name of typing's star import", "cast",
     "class Solution:\n    def cast(self, spell: str, times: int) -> List[str]:\n        return [spell] * times\n",
     [["fire", 2]], [["fire", "fire"]]),
    ("an integral float for an integer answer", "mod_answer",
     "def mod_answer(n):\n    return float(pow(2, n, 10**9 + 7))\n", [[10], [100]], [1024, 976371285]),
]


@pytest.mark.parametrize("why, fn_name, code, inputs, outputs", RIGHT,
                         ids=["dataclass", "dunder_stdout", "fd1_and_atexit", "typing_name", "integral_float"])
def test_right_answers_pass(scorer, why, fn_name, code, inputs, outputs):
    result = scorer.score(fenced(code), {"fn_name": fn_name, "inputs": inputs, "outputs": outputs})
    assert (result.correct, result.reason) == (True, "ok"), why


def test_an_integer_answer_off_by_one_in_a_float_fails(scorer):
    cases = {"fn_name": "mod_answer", "inputs": [[0]], "outputs": [1000000007]}
    assert not scorer.score(fenced("def mod_answer(n):\n    return 1000000006.0\n"), cases).correct
    assert not scorer.score(fenced("def mod_answer(n):\n    return 1000000007.5\n"), cases).correct


def test_exiting_early_or_running_out_of_time(scorer):
    cases = {"fn_name": "add", "inputs": [[1, 2]], "outputs": [3]}
    exits = scorer.score(fenced("import sys\n\ndef add(a, b):\n    sys.exit(0)\n"), cases)
    assert exits.reason == "runtime error on case 0 (0/1 passed)"
    loops = scorer.score(fenced("def add(a, b):\n    while True:\n        pass\n"), cases)
    assert loops.reason == "timeout on case 0 (0/1 passed)"  # the CPU limit kills the solution's process


def test_a_typing_name_is_not_the_response_function(scorer):
    result = scorer.score(fenced("x = 1\n"), {"fn_name": "cast", "inputs": [["int", 1]], "outputs": [1]})
    assert result.reason == "runtime error on case 0 (0/1 passed)"


# Returns a wrong sum after trying every way of putting the right one ("3") where the verdict is read:
# stdout by every route, every descriptor it holds, the driver's descriptors and memory through /proc.
FORGER = '''
import atexit, os, sys
line = b"3\\n"
print(3, file=sys.__stdout__, flush=True)
atexit.register(os.write, 1, line)
for fd in sorted(int(name) for name in os.listdir("/proc/self/fd")):
    try:
        os.write(fd, line)
    except OSError:
        pass
for path in [f"/proc/{os.getppid()}/fd/{n}" for n in range(8)] + [f"/proc/{os.getppid()}/mem"]:
    try:
        os.write(os.open(path, os.O_WRONLY), line)
    except OSError:
        pass

def add(a, b):
    return a + b + 1
'''

# What of the driver the solution can reach: expected nothing.
REACH = '''
import ctypes, os

def reach(paths):
    driver, found = os.getppid(), []
    for path in paths:
        try:
            os.close(os.open(path.format(driver=driver), os.O_WRONLY))
            found.append(path)
        except OSError:
            pass
    if ctypes.CDLL(None, use_errno=True).ptrace(16, driver, None, None) == 0:  # PTRACE_ATTACH
        found.append("ptrace")
    return found
'''


def test_a_program_cannot_forge_the_verdict(scorer):
    forged = scorer.score(fenced(FORGER), {"fn_name": "add", "inputs": [[1, 2]], "outputs": [3]})
    assert not forged.correct and forged.reason.startswith("runtime error on case 0"), forged.reason
    paths = ["/proc/{driver}/fd/0", "/proc/{driver}/fd/1", "/proc/{driver}/fd/2", "/proc/{driver}/mem"]
    reached = scorer.score(fenced(REACH), {"fn_name": "reach", "inputs": [[paths]], "outputs": [[]]})
    assert reached.correct, reached.reason
