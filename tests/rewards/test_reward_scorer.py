"""RewardScorer's batch entry points agree with scoring one group at a time, for math and for code."""

import pytest

from coati.dataset.jsonl import Example
from rewards.scorer import RewardScorer


def fenced(code: str) -> str:
    return f"```python\n{code}\n```"


def test_math_groups_and_evaluation_lists_match_group_scoring():
    scorer = RewardScorer("boxed")
    examples = [Example(messages=(), gt_answer="12"), Example(messages=(), gt_answer="\\frac{1}{2}")]
    groups = [["\\boxed{12}", "\\boxed{13}", "no box"], ["\\boxed{0.5}", "\\boxed{1/2}"]]
    expected = [scorer.score(group, example) for group, example in zip(groups, examples)]
    assert scorer.score_groups(groups, examples) == expected
    assert [[r.correct for r in g] for g in expected] == [[True, False, False], [True, True]]
    assert scorer.score_each(["\\boxed{13}", "\\boxed{1/2}"], examples) == [expected[0][1], expected[1][1]]
    with pytest.raises(ValueError, match="2 groups but 1 examples"):
        scorer.score_groups(groups, examples[:1])


def test_code_groups_are_scored_together_in_order():
    from rewards.code import SandboxUnavailable, check_sandbox_available

    try:
        check_sandbox_available()
    except SandboxUnavailable as err:
        pytest.skip(str(err))
    scorer = RewardScorer("code", {"max_workers": 2})
    double = Example(messages=(), test_cases={"inputs": ["3\n", "-4\n"], "outputs": ["6\n", "-8\n"]})
    negate = Example(messages=(), test_cases={"inputs": ["5\n"], "outputs": ["-5\n"]})
    groups = [[fenced("print(int(input())*2)"), fenced("print(6)"), "no code"],
              [fenced("print(-int(input()))"), fenced("print(int(input())*2)")]]
    results = scorer.score_groups(groups, [double, negate])
    assert [[r.correct for r in g] for g in results] == [[True, False, False], [True, False]]
    assert [r.reason for r in results[0]] == ["ok", "wrong answer on case 1 (1/2 passed)", "no code block"]
    assert results == [scorer.score(group, example) for group, example in zip(groups, [double, negate])]
    each = scorer.score_each([groups[0][0], groups[1][1]], [double, negate])
    assert [r.correct for r in each] == [True, False]
