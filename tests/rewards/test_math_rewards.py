import threading

import pytest

from rewards import FORMAT_REWARD, default_system_prompt
from rewards.math import answers_match, boxed_reward, extract_think_answer, last_boxed, think_answer_reward
from rewards.types import combine


@pytest.mark.parametrize("text, expected", [
    ("so \\boxed{42}.", "42"),
    ("\\boxed{1} then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("\\boxed{a{b}c}", "a{b}c"),
    ("\\boxed{12", None),
    ("no box", None),
])
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


def test_boxed_reward_correct_wrong_and_unformatted():
    right = boxed_reward("\\boxed{579}", "579")
    assert (right.reward, right.correct, right.format_ok, right.extracted) == (1.0, True, True, "579")
    wrong = boxed_reward("\\boxed{578}", "579")
    assert (wrong.reward, wrong.correct, wrong.format_ok, wrong.reason) == (FORMAT_REWARD, False, True, "wrong answer")
    missing = boxed_reward("579", "579")
    assert (missing.reward, missing.correct, missing.format_ok) == (0.0, False, False)


def test_math_verify_equivalence_not_string_equality():
    assert answers_match("\\boxed{\\frac{1}{2}}", "0.5")
    assert answers_match("\\boxed{0.5}", "\\frac12")
    assert not answers_match("\\boxed{5.79}", "579")
    assert boxed_reward("\\boxed{2/4}", "1/2").correct


def test_think_answer_tags():
    good = "<think>3+4 is 7</think><answer>7</answer>"
    assert extract_think_answer(good) == "7"
    assert think_answer_reward(good, "7").reward == 1.0
    assert think_answer_reward("<think>x</think> <answer>\\boxed{7}</answer>", "7").correct
    assert think_answer_reward("<think>x</think><answer>8</answer>", "7").reward == FORMAT_REWARD
    for broken in ("<answer>7</answer>", "<think>a</think><answer>7</answer><answer>7</answer>",
                   "text before <think>a</think><answer>7</answer>", "<think>a<answer>7</answer>"):
        result = think_answer_reward(broken, "7")
        assert not result.format_ok and result.reward == 0.0, broken


def test_rewards_work_off_the_main_thread():
    # math-verify's own timeouts use signal.alarm, which raises outside the main thread.
    results = []
    thread = threading.Thread(target=lambda: results.append(boxed_reward("\\boxed{12}", "12")))
    thread.start()
    thread.join()
    assert results[0].correct


def test_combine_bounds():
    assert combine(False, 1.0) == 0.0
    assert combine(True, 0.0) == FORMAT_REWARD
    assert combine(True, 1.0) == 1.0
    assert combine(True, 0.5) == pytest.approx(FORMAT_REWARD + (1 - FORMAT_REWARD) * 0.5)
    with pytest.raises(ValueError):
        combine(True, 1.5)


def test_default_system_prompts_name_their_format():
    assert "\\boxed{}" in default_system_prompt("boxed")
    assert "<answer>" in default_system_prompt("think_answer_tags")
    assert "```python" in default_system_prompt("code")
