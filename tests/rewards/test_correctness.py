"""What counts as correct in a run (rewards/correctness.py): the rule, accuracy, the user function's verdict
through the scorer, the example file that defines correctness, and the final summary's line."""

import os

import pytest

from coati.dataset.rows import Example
from coati.rollout.evaluation import held_out_line
from rewards.correctness import accuracy, sample_correct
from rewards.scorer import RewardScorer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLOSENESS = os.path.join(ROOT, "examples", "rewards", "closeness.py")
LENGTH = os.path.join(ROOT, "examples", "rewards", "length_penalty.py")


def example(gold="42"):
    return Example(messages=({"role": "user", "content": "6*7?"},), gt_answer=gold, source="t.jsonl:3",
                   row={"gt_answer": gold})


@pytest.mark.parametrize("builtin, weight, verdicts, reward, threshold, expected", [
    (True, 1.0, [], 1.0, None, True),  # the built-in verdict while it weighs
    (False, 0.5, [], 1.0, None, False),
    (True, 0.0, [], 1.0, None, None),  # weighted 0 and nothing else says: not defined
    (True, 1.0, [False], 1.0, None, False),  # a part's own verdict wins over the built-in one
    (False, 0.0, [True, True], 0.0, None, True),
    (False, 0.0, [True, False], 1.0, None, False),  # every part that says must say True
    (False, 0.0, [], 0.7, 0.7, True),  # the threshold on the weighted reward
    (True, 1.0, [], 0.69, 0.7, False),  # ... before the built-in verdict
    (False, 0.0, [True], 0.0, 0.7, True),  # a part's verdict before the threshold
])
def test_the_rule(builtin, weight, verdicts, reward, threshold, expected):
    assert sample_correct(builtin, weight, verdicts, reward, threshold) is expected


def test_accuracy_counts_only_samples_with_a_verdict():
    assert accuracy([True, False, None, True]) == pytest.approx(2 / 3)
    assert accuracy([None, None]) is None and accuracy([]) is None
    assert accuracy([False]) == 0.0


def test_a_function_that_says_what_is_correct_decides_the_accuracy(tmp_path):
    scorer = RewardScorer("boxed", reward_fns=[f"{CLOSENESS}:closeness"], reward_weights="boxed:0")
    near, exact_unboxed, boxed_wrong, none = scorer.score(["about 40", "it is 42", "\\boxed{41}", "no idea"],
                                                          example())
    assert near.reward == pytest.approx(1 - 2 / 42) and near.correct is False
    assert exact_unboxed.reward == 1.0 and exact_unboxed.correct is True  # no box: the built-in says wrong
    # the built-in's reason and format check, weighted 0, give way to the verdict (its score stays in the parts)
    assert exact_unboxed.reason == "correct" and exact_unboxed.format_ok and near.reason == "incorrect"
    assert boxed_wrong.correct is False and none.reward == 0.0 and none.correct is False
    assert exact_unboxed.parts == {"boxed": 0.0, "closeness": 1.0, "closeness/abs_error": 0.0,
                                   "closeness/correct": True}
    # the built-in reward still weighing does not change whose verdict counts
    weighted = RewardScorer("boxed", reward_fns=[f"{CLOSENESS}:closeness"])
    assert weighted.score(["it is 42"], example())[0].correct is True


def test_a_plain_float_function_leaves_the_builtin_verdict_while_it_weighs():
    scorer = RewardScorer("boxed", reward_fns=[f"{LENGTH}:exact_label"])
    right, wrong = scorer.score(["\\boxed{42}", "42 \\boxed{41}"], example())
    assert (right.correct, wrong.correct) == (True, False)


def test_threshold_defines_correctness_for_plain_floats():
    scorer = RewardScorer("boxed", reward_fns=[f"{LENGTH}:exact_label"], reward_weights="boxed:0",
                          correct_threshold=1.0)
    hit, miss = scorer.score(["42 \\boxed{41}", "\\boxed{41}"], example())
    assert (hit.correct, miss.correct) == (True, False)
    # alone with the built-in reward at weight 1 the threshold still applies (no pass-through)
    only = RewardScorer("boxed", correct_threshold=0.05)
    assert only.score(["\\boxed{41}"], example())[0].correct is True  # the format reward 0.1 >= 0.05


def test_reason_codes_are_short():
    [nobox, wrong, right] = RewardScorer("boxed").score(["42", "\\boxed{41}", "\\boxed{42}"], example())
    assert [r.reason_code for r in (nobox, wrong, right)] == ["no \\boxed{} answer", "wrong answer", "ok"]


def test_the_summary_line():
    assert held_out_line("add/sampled", {"accuracy": 0.25, "mean_reward": 0.3},
                         {"accuracy": 0.5, "mean_reward": 0.6}) == \
        "held-out accuracy add/sampled: 0.250 -> 0.500 (+25.0 points)"
    line = held_out_line("add/sampled", {"accuracy": None, "mean_reward": 0.19},
                         {"accuracy": None, "mean_reward": 0.92})
    assert line.startswith("held-out mean reward add/sampled: 0.190 -> 0.920 (+0.730); accuracy not defined (no "
                           "reward of this run defines correctness")
    assert "--correct-threshold" in line and "0.000" not in line
