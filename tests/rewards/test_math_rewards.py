import random
import threading
from decimal import Decimal
from fractions import Fraction
from types import SimpleNamespace

import pytest

from rewards import FORMAT_REWARD, default_system_prompt
from rewards.math import (GoldAnswer, PlainNumber, answers_match, boxed_reward, extract_think_answer, last_boxed,
                          numbers_verdict, plain_number, score_group, think_answer_reward)
from rewards.scorer import RewardScorer
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


@pytest.mark.parametrize("text, value, decimal", [
    ("72", Fraction(72), False), ("1,234,567", Fraction(1234567), False), ("-0.25", Fraction(-1, 4), True),
    ("\\boxed{3.5}", Fraction(7, 2), True), (" 007 ", Fraction(7), False),
    ("12,34", None, None), ("0,500", None, None), ("1.5e3", None, None), ("\\frac{1}{2}", None, None),
    ("5.", None, None), ("+5", None, None), ("", None, None),
])
def test_plain_number(text, value, decimal):
    number = plain_number(text)
    assert (number is None) if value is None else (number == PlainNumber(value, decimal))


@pytest.mark.parametrize("gold, answer, verdict", [
    ("72", "72.0", True), ("72", "73", False), ("1,000", "1000", True),
    ("0.5", "0.6", False),  # 0.1 apart: no rounding to 6 places joins them
    ("0.5", "0.5000001", None), ("0.5", "0.500001", None),  # within 1e-6: math-verify's rounding decides
    ("123456789012345.5", "123456789012345.6", None),  # beyond a 15-digit float's precision
    ("100", "100.000001", None),
])
def test_numbers_verdict(gold, answer, verdict):
    assert numbers_verdict(plain_number(gold), plain_number(answer)) is verdict


def _number_texts(rng: random.Random) -> str:
    """A plain number as a dataset or a model might write it."""
    kind = rng.randrange(5)
    if kind == 0:
        return str(rng.randint(-50, 50))
    if kind == 1:
        return f"{rng.randint(1000, 10**7):,}"
    if kind == 2:
        return f"{rng.uniform(-100, 100):.{rng.randint(1, 4)}f}"
    if kind == 3:
        return f"{rng.randint(0, 9)}.{rng.randint(0, 10**7):07d}"
    return str(rng.choice([0, 1, 2, 10, 100]))


def test_fast_path_agrees_with_math_verify_on_random_numbers():
    rng = random.Random(0)
    pairs = [(_number_texts(rng), _number_texts(rng)) for _ in range(150)]
    pairs += [(a, a) for a, _ in pairs[:40]]  # equal pairs, written identically
    # pairs around math-verify's 6-place rounding: 1e-7 to 1e-5 apart
    pairs += [(a, str(Decimal(a.replace(",", "")) + Decimal(rng.choice([1, 5, 10, 11, 15, 20, 100])) / 10**7))
              for a, _ in pairs[:40]]
    pairs += [(a, b.replace(",", "")) for a, b in pairs[:40] if "," in a + b]
    decided = 0
    for gold, answer in pairs:
        verdict = numbers_verdict(plain_number(gold), plain_number(answer))
        if verdict is not None:
            decided += 1
            assert verdict == answers_match(answer, gold, fast_path=False), (gold, answer)
    assert decided >= 0.85 * len(pairs)


def test_group_parses_gold_once_and_checks_each_distinct_answer_once():
    gold = GoldAnswer("3\\sqrt{2}")
    responses = ["so \\boxed{3\\sqrt{2}}", "hence \\boxed{3\\sqrt{2}}", "\\boxed{\\sqrt{18}}", "no box", "\\boxed{3}"]
    results = score_group(responses, gold, "boxed")
    assert [r.correct for r in results] == [True, True, True, False, False]
    assert [r.format_ok for r in results] == [True, True, True, False, True]
    assert results[0] is results[1]  # the same answer was checked once
    parsed = gold.parsed
    score_group(responses, gold, "boxed")
    assert gold.parsed is parsed


def test_plain_number_group_never_needs_sympy():
    gold = GoldAnswer("1,234")
    results = score_group(["\\boxed{1234}", "\\boxed{1,234}", "\\boxed{1243}"], gold, "boxed")
    assert [r.correct for r in results] == [True, True, False]
    assert gold._parsed is None


def test_scorer_scores_a_group_like_the_single_rewards():
    example = SimpleNamespace(gt_answer="2^{10}")
    responses = ["\\boxed{1024}", "\\boxed{2^{10}}", "\\boxed{20}", "1024"]
    assert RewardScorer("boxed").score(responses, example) == [boxed_reward(r, "2^{10}") for r in responses]
    tagged = ["<think>a</think><answer>1024</answer>", "<think>a</think><answer>20</answer>"]
    assert [r.correct for r in RewardScorer("think_answer_tags").score(tagged, example)] == [True, False]
    with pytest.raises(ValueError, match="unknown reward type"):
        RewardScorer("exact")
