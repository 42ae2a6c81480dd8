"""The generated code dataset: deterministic, valid PRIME rows; reference programs pass and wrong ones fail in
the real sandbox."""

import json
import shutil

import pytest

from coati.dataset.code_task import TASKS, generate_rows, reference_solution, write_code_dataset, wrong_solution
from rewards.code import CodeRewardScorer, SandboxLimits, validate_test_cases

needs_bwrap = pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="bubblewrap is not installed (apt-get install -y bubblewrap)"
)


def test_rows_are_valid_and_deterministic(tmp_path):
    rows = generate_rows(len(TASKS) * 2, seed=3)
    assert rows == generate_rows(len(TASKS) * 2, seed=3)
    assert rows != generate_rows(len(TASKS) * 2, seed=4)
    assert sorted(row["task"] for row in rows) == sorted([task.name for task in TASKS] * 2)  # every task, evenly
    for row in rows:
        assert validate_test_cases(row["test_cases"]) is None
        assert len(set(row["test_cases"]["inputs"])) == 5
        assert row["messages"]["role"] == "user" and row["messages"]["content"]

    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    write_code_dataset(str(first), 7, seed=11)
    write_code_dataset(str(second), 7, seed=11)
    assert first.read_bytes() == second.read_bytes()
    assert [json.loads(line) for line in first.read_text().splitlines()] == generate_rows(7, seed=11)


def test_wrong_programs_are_caught_by_every_row():
    for row in generate_rows(len(TASKS) * 3, seed=0):
        task = next(t for t in TASKS if t.name == row["task"])
        cases = zip(row["test_cases"]["inputs"], row["test_cases"]["outputs"])
        assert any(task.wrong_solve(stdin) != expected for stdin, expected in cases), row["task"]


@needs_bwrap
@pytest.mark.timeout(60)
def test_reference_programs_pass_and_wrong_ones_fail_in_the_sandbox():
    rows = generate_rows(len(TASKS), seed=7)
    responses, cases = [], []
    for row in rows:
        for program in (reference_solution(row["task"]), wrong_solution(row["task"])):
            responses.append(f"Let me think.\n```python\n{program}```")
            cases.append(row["test_cases"])
    with CodeRewardScorer(SandboxLimits(cpu_time_s=2, wall_time_s=3.0), max_workers=2) as scorer:
        results = scorer.score_batch(responses, cases)
    for row, good, bad in zip(rows, results[0::2], results[1::2]):
        assert (good.correct, good.reward, good.reason) == (True, 1.0, "ok"), (row["task"], good.reason)
        assert not bad.correct and bad.reward < 1.0 and bad.reason.startswith("wrong answer"), (row["task"], bad.reason)
