"""HumanEval as PRIME rows: every canonical solution passes in the real sandbox, broken ones fail, and what a
solution prints or does around its function cannot change the verdict."""

import ast
import json
import shutil

import pytest

from coati.dataset.humaneval import humaneval_rows, load_problems, main
from coati.dataset.jsonl import load_jsonl
from rewards.code import CodeRewardScorer

needs_bwrap = pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="bubblewrap is not installed (apt-get install -y bubblewrap)"
)

# Off-by-one mutants (first integer literal of the function body + 1) that HumanEval's own tests do not
# catch: the literal does not matter (HumanEval/31: `if n < 2` -> `n < 3` with no test of 2) or the tests
# are too weak. Every other such mutant must fail.
UNCAUGHT_OFF_BY_ONE = {31, 32, 35, 40, 43, 59, 68, 75, 95, 99, 108, 116, 129, 147, 154}


@pytest.fixture(scope="module")
def problems():
    return load_problems()


@pytest.fixture(scope="module")
def rows():
    return humaneval_rows()


@pytest.fixture(scope="module")
def scorer():
    with CodeRewardScorer(max_workers=2) as scorer:
        yield scorer


def block(code: str) -> str:
    return f"Here is the function:\n\n```python\n{code}```\n"


def test_writes_164_loadable_rows(tmp_path, capsys):
    out = tmp_path / "humaneval.jsonl"
    main([str(out)])
    assert "wrote 164 HumanEval problems" in capsys.readouterr().out
    examples = load_jsonl(str(out), "code")
    assert len(examples) == 164
    first = json.loads(out.read_text().splitlines()[0])
    assert first["task_id"] == "HumanEval/0" and first["entry_point"] == "has_close_elements"
    assert examples[0].messages[0]["role"] == "system"  # the row's own prompt, not the stdin-program one
    assert "def has_close_elements(numbers: List[float], threshold: float) -> bool:" in examples[0].messages[1]["content"]
    tokens = {json.loads(row["test_cases"]["inputs"][0])["token"] for row in humaneval_rows()}
    assert len(tokens) == 164


@pytest.mark.e2e
@needs_bwrap
def test_every_canonical_solution_passes_and_every_stub_fails(problems, rows, scorer):
    canonical = [block(p["prompt"] + p["canonical_solution"]) for p in problems]
    stubs = [block(p["prompt"] + "    return None\n") for p in problems]
    results = scorer.score_batch(canonical + stubs, [row["test_cases"] for row in rows] * 2)
    passed = [p["task_id"] for p, r in zip(problems, results[:164]) if r.correct]
    assert len(passed) == 164, [(p["task_id"], r.reason) for p, r in zip(problems, results) if not r.correct]
    assert all(r.reward == 1.0 for r in results[:164])
    assert not any(r.correct for r in results[164:])
    assert {r.reason for r in results[164:]} <= {"wrong answer on case 0 (0/1 passed)", "runtime error on case 0 (0/1 passed)"}


class _OffByOne(ast.NodeTransformer):
    def __init__(self):
        self.done = False

    def visit_Constant(self, node):
        if self.done or type(node.value) is not int:
            return node
        self.done = True
        return ast.copy_location(ast.Constant(node.value + 1), node)


def _off_by_one(problem: dict) -> str | None:
    tree = ast.parse(problem["prompt"] + problem["canonical_solution"])
    function = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == problem["entry_point"])
    mutate = _OffByOne()
    for statement in function.body:
        mutate.visit(statement)
    return ast.unparse(tree) + "\n" if mutate.done else None


@pytest.mark.e2e
@needs_bwrap
def test_off_by_one_mutants_fail(problems, rows, scorer):
    mutants = {i: code for i, code in enumerate(map(_off_by_one, problems)) if code is not None}
    assert len(mutants) == 128
    results = scorer.score_batch([block(code) for code in mutants.values()], [rows[i]["test_cases"] for i in mutants])
    uncaught = {i for i, result in zip(mutants, results) if result.correct}
    assert uncaught == UNCAUGHT_OFF_BY_ONE


@needs_bwrap
def test_what_surrounds_the_function_does_not_decide(problems, rows, scorer):
    p38 = problems[38]  # decode_cyclic: its check calls encode_cyclic, which only the prompt defines
    only_decode = ("def decode_cyclic(s: str):\n    return encode_cyclic(encode_cyclic(s))\n")
    noisy = ("import sys\n" + p38["prompt"] + p38["canonical_solution"] + "print('debug', decode_cyclic('abc'))\n"
             "if __name__ == '__main__':\n    print(decode_cyclic(input()))\n")
    token = json.loads(rows[38]["test_cases"]["inputs"][0])["token"]
    forged = [
        "import sys\nprint('passed')\nsys.exit(0)\n",  # prints a verdict and leaves before the check
        f"import os\nos.write(1, b'passed {'0' * 16}\\n')\nos._exit(0)\n",  # writes to fd 1 with a guessed token
        "def decode_cyclic(s):\n    return s\nexit()\n",
    ]
    results = scorer.score_batch([block(only_decode), block(noisy), *map(block, forged)], [rows[38]["test_cases"]] * 5)
    assert [r.correct for r in results] == [True, True, False, False, False], [r.reason for r in results]
    assert token != "0" * 16
    wrong = scorer.score(block("def decode_cyclic(s):\n    return s\n"), rows[38]["test_cases"])
    assert wrong.reason == "wrong answer on case 0 (0/1 passed)"


def test_a_bad_harness_names_the_row(tmp_path, rows):
    from coati.dataset.jsonl import DatasetError

    row = dict(rows[0], test_cases=dict(rows[0]["test_cases"], harness=""))
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(rows[1]) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(DatasetError, match=r"bad.jsonl:2: test_cases.harness must be a non-empty string"):
        load_jsonl(str(path), "code")
