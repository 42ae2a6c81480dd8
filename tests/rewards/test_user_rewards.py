"""--reward-fn and --reward-weights: loading the user's function, the one-line errors, the weighted sum."""

import math
import os

import pytest

from coati.dataset.rows import Example
from rewards.combine import CombinedRewards, RewardWeightsError, parse_weights
from rewards.scorer import RewardScorer
from rewards.user import RewardFnError, load_reward_fn

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "rewards", "length_penalty.py")


def example(gold="42", row=None):
    row = row if row is not None else {"messages": "What is 6*7?", "gt_answer": gold, "difficulty": 3}
    return Example(messages=({"role": "user", "content": "What is 6*7?"},), gt_answer=gold, source="train.jsonl:7",
                   row=row)


def write(tmp_path, source: str) -> str:
    path = tmp_path / "my_reward.py"
    path.write_text(source)
    return str(path)


def test_weights_applied_to_builtin_and_user_functions():
    scorer = RewardScorer("boxed", reward_fns=[f"{EXAMPLE}:length_penalty", f"{EXAMPLE}:exact_label"],
                          reward_weights="boxed:2,length_penalty:0.5")
    short, long_wrong = "\\boxed{42}", "x" * 164 + " \\boxed{41}"
    right, wrong = scorer.score([short, long_wrong], example())
    assert right.reward == pytest.approx(2 * 1.0 + 0.5 * 0.0 + 1 * 1.0)
    assert right.correct and right.parts == {"boxed": 1.0, "length_penalty": 0.0, "length_penalty/chars": 10.0,
                                             "exact_label": 1.0}
    # 175 chars: 111 beyond the budget of 64 -> -0.222; the built-in gives the format reward 0.1
    assert wrong.reward == pytest.approx(2 * 0.1 + 0.5 * (-0.002 * 111) + 0.0)
    assert not wrong.correct and wrong.format_ok


def test_builtin_weight_zero_replaces_it_and_its_verdict():
    scorer = RewardScorer("boxed", reward_fns=[f"{EXAMPLE}:exact_label"], reward_weights="boxed:0")
    [result] = scorer.score_each(["the answer is 42, \\boxed{41}"], [example()])
    assert result.reward == 1.0  # the user's function alone decides the reward
    # and no reward of the run says what is correct: the built-in verdict (wrong) is not reported as the run's,
    # nor is its reason: the reason is what the weighted rewards decided
    assert result.correct is None and result.reason == "reward 1" and result.format_ok
    assert result.reason_code == "no verdict"  # counted over samples as one cause, whatever the graded value
    assert result.extracted is None


def test_a_builtin_at_weight_zero_leaves_no_format_check_or_reason_of_its_own(tmp_path):
    """A plain-text answer scored by the user's verdict alone: not "no \\boxed{} answer", not a format failure."""
    path = write(tmp_path, "def f(response, label, row):\n    return 1.0, {'correct': label in response}\n")
    scorer = RewardScorer("boxed", reward_fns=[f"{path}:f"], reward_weights="boxed:0")
    right, wrong = scorer.score_each([" 42", " 41"], [example("42"), example("42")])
    assert (right.correct, right.reason, right.reason_code, right.format_ok) == (True, "correct", "correct", True)
    assert (wrong.correct, wrong.reason, wrong.format_ok, wrong.extracted) == (False, "incorrect", True, None)
    kept = RewardScorer("boxed", reward_fns=[f"{path}:f"], reward_weights="boxed:0.5").score_each([" 42"],
                                                                                                   [example("42")])
    assert not kept[0].format_ok and kept[0].reason_code == "no \\boxed{} answer"  # weighted: its check stands


def test_only_builtin_at_weight_one_is_unchanged():
    scorer = RewardScorer("boxed")
    assert scorer.score(["\\boxed{42}"], example())[0].parts is None


def test_the_function_gets_label_and_whole_row(tmp_path):
    path = write(tmp_path, "def f(response, label, row):\n    return float(row['difficulty']) + len(label)\n")
    scorer = RewardScorer("boxed", reward_fns=[f"{path}:f"], reward_weights="boxed:0")
    groups = scorer.score_groups([["a"], ["b"]], [example("42"), example("1234")])
    assert [g[0].reward for g in groups] == [5.0, 7.0]


@pytest.mark.parametrize("spec_of, source, message", [
    (lambda p: "nowhere/reward.py:f", "", "file not found: nowhere/reward.py"),
    (lambda p: f"{p}", "def f(r, l, w): return 1\n", "must be path/to/file.py:function_name"),
    (lambda p: f"{p}:g", "def f(r, l, w): return 1\n", "has no 'g' (functions there: f)"),
    (lambda p: f"{p}:f", "def f(response): return 1\n", "cannot take (response, label, row)"),
    (lambda p: f"{p}:f", "X = 1\nf = 3\n", "int is not callable"),
    (lambda p: f"{p}:f", "import not_a_module_anywhere\n", "importing"),
])
def test_bad_function_is_one_line_at_load(tmp_path, spec_of, source, message):
    path = write(tmp_path, source)
    with pytest.raises(RewardFnError) as err:
        load_reward_fn(spec_of(path))
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("body, message", [
    ("raise KeyError('answer')", "raised on train.jsonl:7: KeyError: 'answer'"),
    ("return float('nan')", "returned nan; return a finite number"),
    ("return 'good'", "returned str 'good'; return a number"),
    ("return None", "returned NoneType None"),
    ("return True", "returned bool True"),
    ("return 1.0, {'part': 'x'}", "(part 'part') returned str"),
    ("return 1.0, {'correct': 'yes'}", "returned {'correct': 'yes'} (str); 'correct' must be True or False"),
    ("return 1.0, {'correct': 1}", "'correct' must be True or False"),
    ("return [1.0, 2.0]", "returned a list of 2; return a number or (number, {name: number})"),
    ("return 1.0, True", "returned a tuple of 2"),
])
def test_function_raising_or_returning_no_number_names_the_row(tmp_path, body, message):
    path = write(tmp_path, f"def f(response, label, row):\n    {body}\n")
    scorer = RewardScorer("boxed", reward_fns=[f"{path}:f"])
    with pytest.raises(RewardFnError) as err:
        scorer.score(["\\boxed{42}"], example())
    text = str(err.value)
    assert message in text and f"--reward-fn {path}:f" in text and "train.jsonl:7" in text and "\n" not in text


def test_numpy_numbers_are_numbers(tmp_path):
    np = pytest.importorskip("numpy")
    path = write(tmp_path, "import numpy as np\ndef f(response, label, row):\n    return np.float32(0.5)\n")
    assert RewardScorer("boxed", reward_fns=[f"{path}:f"]).score(["x"], example())[0].reward == 0.5
    assert np is not None


@pytest.mark.parametrize("text, message", [
    ("boxed", "must be name:weight"), ("boxed:x", "must be name:weight"), ("boxed:inf", "must be name:weight"),
    ("boxed:1,boxed:2", "names 'boxed' twice"),
])
def test_bad_weights(text, message):
    with pytest.raises(RewardWeightsError, match=message):
        parse_weights(text)


def test_weights_must_name_rewards_of_this_run():
    with pytest.raises(RewardWeightsError, match="'lenght_penalty', which is no reward of this run"):
        CombinedRewards("boxed", [f"{EXAMPLE}:length_penalty"], weights="lenght_penalty:1")
    assert parse_weights(" boxed:1 , x:-0.5 ") == {"boxed": 1.0, "x": -0.5}
    assert math.isclose(CombinedRewards("boxed", weights="boxed:0.25").weights["boxed"], 0.25)
