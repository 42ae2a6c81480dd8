"""Answers of several values across several boxes; hedging (several candidates for one value) never wins; the
verdicts agree with math-verify's own reading of the whole response, except where docs/rewards.md says why not."""

import pytest
from math_verify import LatexExtractionConfig, parse, verify

from rewards.math import GoldAnswer, answer_parts, final_boxes, score_group

# (gold, response, our verdict)
MULTI = [
    ("1, -2", r"The roots are $\boxed{-2} \text{ and } \boxed{1}$.", True),
    ("1, -2", r"So $x = \boxed{1}$ or $x = \boxed{-2}$.", True),
    ("1, -2", r"\boxed{1}, \boxed{-2}, \boxed{1}", True),  # a repeated value is one value
    ("(2, 2), (6, 2)", r"\boxed{(2, 2)} \quad\text{and}\quad \boxed{(6, 2)}", True),
    ("(2, 2), (6, 2)", r"\boxed{(6, 2)}, \boxed{(2, 2)}", True),  # a set of solutions: order-free
    (r"\{1, 2\}", r"\boxed{2} and \boxed{1}", True),
    ("x=1, x=-2", r"\boxed{x=-2}, \boxed{x=1}", True),
    ("1, -2", r"\boxed{1, -2}", True),  # one box holding the list, as before
    ("1, -2", r"\boxed{1}", False),  # half of the answer
    ("1, -2", r"\boxed{1} and \boxed{-2} and \boxed{3}", False),  # one too many
    ("1, -2", r"\boxed{1} and \boxed{2}", False),
    ("(2, 2), (6, 2)", r"\boxed{(2, 2)}", False),
]
HEDGING = [
    ("5", r"\boxed{5} or \boxed{6}", False),
    ("5", r"\boxed{6} or \boxed{5}", False),  # the right one last still loses
    ("5", r"$\boxed{4}$, $\boxed{5}$, $\boxed{6}$", False),
    (r"\frac{1}{2}", r"\boxed{\frac{1}{2}} or \boxed{\frac{1}{3}}", False),
    ("5", r"\boxed{5} so \boxed{5}", True),  # the same answer twice is not hedging
    (r"\frac12", r"\boxed{1/2} or \boxed{0.5}", True),  # two ways of writing the one value
]
# Answers in several parts, as math-verify reads them: a gold of several boxes is the list of its parts (the boxes
# near each other or joined by "and", "or", "," or ";"; a box far before the last is not a part), and a gold of
# several values is also matched by the parts a response gives apart ("for part (a) and", "y_2 =").
PARTS = [
    (r"\boxed{1}\boxed{2}", r"$\boxed{1,2}$", True),
    (r"\boxed{1}\boxed{2}", r"$\boxed{2, 1}$", True),
    (r"\boxed{1}\boxed{2}", r"\boxed{1, 3}", False),
    (r"\boxed{1}\boxed{2}", r"\boxed{2}", False),  # the last box alone is half of the answer
    (r"\(\boxed{3}\) and \(\boxed{-4}\).", r"\boxed{-4, 3}", True),
    (r"\(\boxed{3}\) and \(\boxed{-4}\).", r"\boxed{3}", False),
    (r"\boxed{5} cats and \boxed{7} dogs", r"\boxed{5, 7}", True),
    (r"\boxed{5} cats and \boxed{7} dogs", r"\boxed{5, 8}", False),
    (r"\boxed{5} after a long argument that has nothing to list \boxed{7}", r"\boxed{7}", True),  # one value
    (r"\boxed{5} after a long argument that has nothing to list \boxed{7}", r"\boxed{5, 7}", False),
    ("3 and -4", r"\boxed{3, -4}", True),
    ("3 and -4", r"\boxed{-4}", False),
    ("(3, 3), (1, 1)", r"$$\boxed{(3, 3)} \text{ for part (a) and } \boxed{(1, 1)} \text{ for part (b)}$$", True),
    ("(3, 3), (1, 1)", r"$$\boxed{(3, 3)} \text{ for part (a) and } \boxed{(1, 2)} \text{ for part (b)}$$", False),
    (r"y_{1}=2x+1, y_{2}=4-x", r"\(y_1 = \boxed{2x + 1}\) and \(y_2 = \boxed{-x + 4}\)", True),
    (r"y_{1}=2x+1, y_{2}=4-x", r"\(y_1 = \boxed{2x + 1}\) and \(y_2 = \boxed{x + 4}\)", False),
    ("1, 2", r"\boxed{1} is one root; dividing the polynomial by x - 1 leaves a linear factor whose only root is "
             r"\boxed{2}", False),  # too far apart: the last box alone
    ("1, 2", r"\boxed{1}; \boxed{2}; \boxed{3}", False),
]
# Where we deliberately differ from math-verify's reading of the whole response (docs/rewards.md):
DIFFERENT = [
    # the last box counts: a box that reasoning separates from the final one is a step, not part of the answer
    ("4", r"First \boxed{3}, but checking again the answer is \boxed{4}.", True, False),
    # an interval (or a point) is one value: two boxes naming its ends are two candidates
    ("(1, 2)", r"\boxed{1}, \boxed{2}", False, True),
    # the final listed boxes are the answer even when math-verify also reads a step's box as a part
    ("1, 2", r"\boxed{7} is the sum of squares; hence the roots are \boxed{1} and \boxed{2}", True, False),
]
_LATEX = (LatexExtractionConfig(boxed_match_priority=0),)


def ours(gold, response, reward_type="boxed", fast_path=True):
    return score_group([response], GoldAnswer(gold, fast_path), reward_type)[0].correct


def math_verify_verdict(gold, response):
    gold_text = gold if "\\boxed" in gold else f"\\boxed{{{gold}}}"
    return bool(verify(parse(gold_text, extraction_config=_LATEX), parse(response, extraction_config=_LATEX)))


@pytest.mark.parametrize("gold, response, expected", MULTI + HEDGING + PARTS)
def test_verdicts_agree_with_math_verify(gold, response, expected):
    assert ours(gold, response) == ours(gold, response, fast_path=False) == expected
    assert math_verify_verdict(gold, response) == expected


@pytest.mark.parametrize("gold, response, expected, theirs", DIFFERENT)
def test_deliberate_differences(gold, response, expected, theirs):
    assert ours(gold, response) == expected and math_verify_verdict(gold, response) == theirs


def test_inside_the_answer_tag():
    response = r"<think>x^2 + x - 2 = 0</think><answer>$\boxed{1}$ and $\boxed{-2}$</answer>"
    assert ours("1, -2", response, "think_answer_tags")
    assert not ours("1", r"<think>t</think><answer>\boxed{1} or \boxed{2}</answer>", "think_answer_tags")


def test_a_group_scores_each_box_list_once_and_records_it():
    results = score_group([r"\boxed{1} and \boxed{-2}", r"\boxed{-2} and \boxed{1}", r"\boxed{1}"] * 2,
                          GoldAnswer("1, -2"), "boxed")
    assert [r.correct for r in results] == [True, True, False] * 2
    assert results[0].extracted == "1, -2" and results[1].extracted == "-2, 1" and results[2].extracted == "1"
    assert results[0] is results[3]  # the same boxes: one check


def test_final_boxes():
    assert final_boxes(r"\boxed{a} then more reasoning \boxed{b} , \boxed{c}") == ["b", "c"]
    assert final_boxes(r"\boxed{\boxed{3}}") == [r"\boxed{3}"] and final_boxes("none") == []
    assert final_boxes(r"\boxed{1}\\ \boxed{2}") == ["1", "2"]


def test_a_math_solution_ending_in_listed_boxes_is_a_list_gold():
    from coati.dataset.rows import final_answer

    gold = final_answer(r"Factoring, $(x - 1)(x + 2) = 0$, so $x = \boxed{1}$ or $x = \boxed{-2}$.")
    assert gold == "1, -2" and ours(gold, r"\boxed{-2} \text{ and } \boxed{1}")
    assert final_answer(r"First \boxed{3}; checking again, \boxed{4}.") == "4"


def test_answer_parts():
    assert answer_parts(r"\boxed{1}\boxed{2}") == ["1", "2"]
    assert answer_parts(r"\boxed{1} no no no no no \boxed{2}") == ["2"]  # 10 characters or more, no separator
    assert answer_parts(r"\boxed{1} papers and \boxed{2} bins") == ["1", "2"]  # under 70 characters with "and"
    assert answer_parts(r"\boxed{1}" + " and" + " x" * 40 + r"\boxed{2}") == ["2"]  # 70 or more: not a part
    assert answer_parts(r"\boxed{a} \boxed{b}, \boxed{b}") == ["a", "b"] and answer_parts("none") == []


def test_a_multi_part_gold_records_the_parts_it_matched():
    result = score_group([r"$$\boxed{(3, 3)} \text{ for (a) and } \boxed{(1, 1)} \text{ for (b)}$$"],
                         GoldAnswer("(3, 3), (1, 1)"), "boxed")[0]
    assert (result.correct, result.extracted, result.reason) == (True, "(3, 3), (1, 1)", "ok")
    gold = GoldAnswer(r"\boxed{1}\boxed{2}")
    assert gold.reading == "1, 2" and gold.several and gold.number is None
    assert GoldAnswer(r"\boxed{1} no no no no no \boxed{2}").number.value == 2  # one value: the last box
