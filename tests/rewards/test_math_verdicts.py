"""Verdicts on answers written the way MATH and GSM8K write them, through both math reward formats.

Each row: gold answer (as a dataset holds it), the model's final answer, the verdict a MATH grader would give,
and why. Every row is checked through ``boxed`` (a worked response ending in ``$\\boxed{answer}$``) and
through ``think_answer_tags`` (the answer alone in the answer tag), each with the plain-number fast path on
and off: the two must agree with each other and with the row.
"""

import pytest

from rewards.math import GoldAnswer, numbers_verdict, parse_math, plain_number, provably_different, score_group

ROWS = [
    # the verdicts the issue found wrong, and a plain one
    ("4\\pi", "4", False, "dropping pi changes the value"),
    ("5\\sqrt{5}", "5", False, "dropping the radical changes the value"),
    ("3\\sqrt{2}", "3\\sqrt{2}", True, "identical"),
    ("2\\pi", "2\\pi", True, "identical"),
    ("2^{10}", "1024", True, "the power evaluated"),
    ("3x+2", "2+3x", True, "terms in another order"),
    ("579", "579", True, "identical integer"),
    # integers, thousands commas (GSM8K writes 1,234; MATH writes 10,\!000 or 1{,}000)
    ("72", "27", False, "digits swapped"),
    ("1,234", "1234", True, "thousands comma dropped"),
    ("1234", "1,234", True, "thousands comma added"),
    ("1,000,000", "1000000", True, "two thousands commas"),
    ("10,\\!000", "10000", True, "MATH's comma with a negative thin space"),
    ("1{,}000", "1000", True, "comma in braces, as LaTeX typesets it"),
    ("1,234", "1.234", False, "a decimal point is not a thousands separator"),
    ("12,34", "1234", False, "a comma not before three digits separates two numbers"),
    ("007", "7", True, "leading zeros"),
    ("-0", "0", True, "negative zero is zero"),
    ("18", "\\$18", True, "dollar sign"),
    ("\\$1,000", "1000", True, "dollar sign and thousands comma in the gold"),
    ("1,234", "1 234", False, "LIMITATION: math-verify reads a space between digits as an operation (1 234 -> 235); "
     "MATH never writes thousands that way"),
    ("0.5", "0,5", False, "a decimal comma reads as the list 0, 5"),
    ("1\\,000", "1000", False, "LIMITATION: math-verify reads a thin space between digits as a product (1*0); "
     "MATH writes thousands as 1{,}000 or 1,\\!000, which both pass"),
    # decimals
    ("72", "72.0", True, "same value with a decimal point"),
    ("0.5", "0.50", True, "trailing zero"),
    ("0.5", ".5", True, "leading zero left out"),
    ("\\$2.50", "2.5", True, "price with cents"),
    ("3.14", "3.14159", False, "a different decimal"),
    ("1.25", "1.2", False, "rounded too far"),
    ("0.5", "0.5000001", True, "math-verify compares decimals rounded to 6 places"),
    ("0.5", "0.500001", False, "differs in the 6th decimal place"),
    ("-3", "-3.0", True, "negative with a decimal point"),
    # fractions
    ("\\frac{3}{4}", "\\dfrac{3}{4}", True, "\\dfrac is \\frac"),
    ("\\dfrac{3}{4}", "3/4", True, "slash fraction"),
    ("3/4", "\\frac{6}{8}", True, "unreduced fraction of the same value"),
    ("\\frac{3}{4}", "\\frac{4}{3}", False, "reciprocal"),
    ("\\frac{1}{2}", "\\frac12", True, "brace-less \\frac"),
    ("0.5", "\\frac{1}{2}", True, "decimal and fraction"),
    ("\\frac{3}{4}", "0.75", True, "fraction and exact decimal"),
    ("-\\frac{2}{3}", "\\frac{-2}{3}", True, "sign inside the fraction"),
    ("\\frac{1}{3}", "0.333333", True, "math-verify accepts a decimal equal to 6 places"),
    ("\\frac{1}{3}", "0.33", False, "decimal too coarse"),
    # radicals
    ("3\\sqrt{2}", "\\sqrt{18}", True, "same radical, not simplified"),
    ("3\\sqrt{2}", "3", False, "radical dropped"),
    ("\\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt3}{2}", True, "brace-less \\sqrt"),
    ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}", True, "rationalised denominator"),
    ("2\\sqrt{3}", "2\\sqrt{2}", False, "different radicand"),
    # pi
    ("4\\pi", "4 \\pi", True, "spacing"),
    ("4\\pi", "\\pi \\cdot 4", True, "factors in another order"),
    ("\\frac{\\pi}{2}", "\\pi/2", True, "slash fraction of pi"),
    ("2\\pi", "6.28", False, "a decimal approximation of an exact answer"),
    ("\\frac{\\pi}{2}", "90^\\circ", False, "radians asked, degrees given"),
    # exponents and scientific notation
    ("2^{10}", "20", False, "2*10 is not 2^10"),
    ("x^2", "x^{2}", True, "braces around the exponent"),
    ("1.5\\times10^{3}", "1500", True, "scientific notation evaluated"),
    ("1500", "1.5 \\times 10^3", True, "plain gold, scientific answer"),
    ("3 \\times 10^8", "300000000", True, "large power of ten"),
    ("6.02\\times10^{23}", "6.02\\times10^{22}", False, "exponent off by one"),
    ("1500", "1.5e3", False, "LIMITATION: in LaTeX e is Euler's number, so 1.5e3 reads as 1.5*e*3; a MATH grader "
     "rejects it too"),
    # negatives
    ("-5", "-5", True, "identical negative"),
    ("-5", "5", False, "sign dropped"),
    # intervals
    ("[1,3)", "[1,3)", True, "identical half-open interval"),
    ("[1,3)", "[1,3]", False, "endpoint included"),
    ("(-\\infty, 2]", "(-\\infty,2]", True, "spacing"),
    ("(-\\infty, 2]", "x \\le 2", False, "interval asked, inequality given (math-verify compares a relation with a "
     "set only when the answer is the set)"),
    ("(0,1)", "(0, 1)", True, "open interval with a space"),
    # tuples, points, vectors
    ("(3,-1)", "(3, -1)", True, "point with a space"),
    ("(3,-1)", "(-1,3)", False, "coordinates swapped"),
    ("(1,2,3)", "(1,3,2)", False, "ordered triple in another order"),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\frac{\\pi}{2})", True, "\\left( \\right) are parentheses"),
    ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}", True, "column vector"),
    # sets and lists of solutions
    ("\\{1,2\\}", "\\{2,1\\}", True, "a set has no order"),
    ("\\{1,2\\}", "\\{1,2,3\\}", False, "extra element"),
    ("-2, 3", "3, -2", True, "MATH lists all solutions; order is free"),
    ("1, 2", "1", False, "one solution missing"),
    # equations
    ("x=3", "3", True, "the value of the unknown"),
    ("3", "x=3", True, "answer written as an assignment"),
    ("x=3", "x=4", False, "wrong value"),
    ("y=2x+1", "y=1+2x", True, "same line, terms in another order"),
    ("x = 3 \\text{ or } x = -1", "3, -1", True, "both roots"),
    ("x=3", "y=3", False, "another variable: math-verify keeps assignments to different names apart"),
    # algebraic expressions
    ("x^2-1", "(x-1)(x+1)", True, "factored form"),
    ("3x+2", "3x-2", False, "sign of a term"),
    ("a+b", "b+a", True, "commuted"),
    ("\\frac{x}{2}", "0.5x", True, "decimal coefficient"),
    ("2+3i", "3i+2", True, "complex number, terms in another order"),
    # percentages
    ("10\\%", "10", True, "MATH graders drop the percent sign"),
    ("10\\%", "10\\%", True, "identical"),
    ("10\\%", "0.1", True, "math-verify also accepts the fraction the percentage stands for"),
    ("10\\%", "20\\%", False, "different percentage"),
    ("25", "25\\%", True, "GSM8K's plain gold to a question asking for a percentage"),
    # units and \text{}
    ("5\\text{ cm}", "5", True, "unit dropped"),
    ("5", "5\\text{ cm}", True, "unit added"),
    ("5\\text{ cm}", "6\\text{ cm}", False, "wrong number with the unit"),
    ("12\\mbox{ inches}", "12", True, "\\mbox unit"),
    ("4 \\text{ cm}^2", "4", True, "squared unit"),
    ("18", "18 \\text{ dollars}", True, "unit as words"),
    ("18", "18 apples", True, "a bare unit word math-verify knows"),
    ("18", "18 dollars", False, "LIMITATION: math-verify's unit list lacks 'dollars', so the bare word reads as a "
     "product of letters; \\text{ dollars} and \\$18 pass (rows above). Hendrycks' MATH grader rejects it too"),
    ("\\text{Monday}", "\\text{Monday}", True, "a word answer"),
    ("\\text{Monday}", "\\text{Tuesday}", False, "a different word"),
    ("\\text{even}", "\\text{odd}", False, "a different word"),
    # degrees
    ("30^\\circ", "30", True, "degree sign dropped"),
    ("30", "30^{\\circ}", True, "degree sign added"),
    ("30^\\circ", "60^\\circ", False, "wrong angle"),
    # multiple choice
    ("\\text{(B)}", "B", True, "MATH's choice letter in \\text"),
    ("B", "(B)", True, "letter in parentheses"),
    ("(D)", "\\textbf{(D)}", True, "letter in bold"),
    ("B", "\\text{(C)}", False, "another choice"),
    ("\\textbf{(B) }12", "B", False, "LIMITATION: an AMC-style gold holding letter and value reads as b*12, which "
     "neither the letter nor the value matches; MATH itself writes the letter alone"),
    # nested braces
    ("2", "\\frac{1}{\\frac{1}{2}}", True, "nested fraction"),
    ("\\frac{\\sqrt{3}}{2}", "\\dfrac{\\sqrt{3}}{2}", True, "braces two deep"),
    ("\\sqrt{\\frac{1}{4}}", "\\frac{1}{2}", True, "root of a fraction"),
    # written answers
    ("5", "5 apples", True, "trailing words after the number are units to math-verify"),
    ("5", "5.", True, "a full stop ends the sentence, not the number"),
    ("x=5", "x = 5.", True, "full stop after an equation"),
    ("4", "4\\pi.", False, "a full stop does not make math-verify read a prefix"),
    ("5", "The answer is 5", False, "a sentence is not an answer: the format asks for the answer alone"),
    ("\\frac{1}{2}", "$\\frac{1}{2}$", True, "the answer in math delimiters"),
    ("$\\frac{1}{2}$", "0.5", True, "the gold in math delimiters"),
    ("10%", "10", True, "a bare percent sign in the gold (a comment in LaTeX) is still a percentage"),
    ("The area is $\\boxed{12}$ square units.", "12", True, "a whole MATH solution as gold: its last box counts"),
    # what a small policy writes early in training: letters among the digits parse to polynomials
    ("118", "1u85", False, "a product with a free symbol (85u) is never a number"),
    ("126", "14q9", False, "126q is not 126"),
    ("10", "10n", False, "10n is not 10"),
    ("4", "x^2+4", False, "a polynomial with a non-constant part"),
    ("6", "x(x+1)-x^2-x+6", True, "a polynomial whose symbols cancel is the constant"),
    ("1", "\\sin^2 x + \\cos^2 x", True, "not a polynomial: math-verify's simplification decides"),
    ("11", "11e", False, "e is Euler's number: 11e is a number, and not 11"),
    ("y", "Y", True, "a symbol gold is not a plain number: math-verify compares the letters"),
    ("", "5", False, "an empty gold answer matches nothing"),
    ("5", " ", False, "an empty box answers nothing"),
]


def boxed_response(answer: str) -> str:
    return f"We work it out step by step, which gives the final answer $\\boxed{{{answer}}}$."


def think_response(answer: str) -> str:
    return f"<think>We work it out step by step.</think><answer>{answer}</answer>"


# Whole responses, for rows about where in the response the answer sits.
RESPONSE_ROWS = [
    ("4", "boxed", "First \\boxed{3}, but checking again the answer is \\boxed{4}.", True, "the last box counts"),
    ("3", "boxed", "First \\boxed{3}, but checking again the answer is \\boxed{4}.", False, "an earlier box does not"),
    ("5", "boxed", "So $\\boxed{5}$. I hope it is correct.", True, "text after the box"),
    ("\\frac{1}{2}", "boxed", "\\boxed{\\frac{1}{2}} apples", True, "text after a nested box"),
    ("12", "boxed", "\\boxed{12", False, "an unclosed box is no answer"),
    ("\\frac{1}{2}", "boxed", "The answer is $\\frac{1}{2}$.", False, "no box: the format was not followed"),
    ("3\\sqrt{2}", "think_answer_tags", "<think>x</think><answer>\\boxed{3\\sqrt{2}}</answer>", True,
     "a box inside the answer tag"),
    ("7", "think_answer_tags", "<think>x</think><answer>The answer is $7$.</answer>", True,
     "delimited math inside the answer tag"),
    ("4\\pi", "think_answer_tags", "<think>x</think><answer>4</answer>", False, "pi dropped, in tags"),
    ("7", "think_answer_tags", "<answer>7</answer>", False, "no think block"),
]


def _verdicts(gold: str, response: str, reward_type: str) -> tuple[bool, bool]:
    fast, slow = (score_group([response], GoldAnswer(gold, fast_path), reward_type)[0] for fast_path in (True, False))
    return fast.correct, slow.correct


@pytest.mark.parametrize("gold, answer, expected, why", ROWS, ids=[f"{r[0]}|{r[1]}" for r in ROWS])
@pytest.mark.parametrize("reward_type", ["boxed", "think_answer_tags"])
def test_verdict(gold, answer, expected, why, reward_type):
    response = boxed_response(answer) if reward_type == "boxed" else think_response(answer)
    fast, slow = _verdicts(gold, response, reward_type)
    assert fast == slow, f"fast path and math-verify disagree on {answer!r} vs gold {gold!r}"
    assert fast == expected, f"{answer!r} vs gold {gold!r} should be {'right' if expected else 'wrong'}: {why}"


@pytest.mark.parametrize("gold, reward_type, response, expected, why", RESPONSE_ROWS,
                         ids=[f"{r[0]}|{r[2]}" for r in RESPONSE_ROWS])
def test_verdict_in_context(gold, reward_type, response, expected, why):
    fast, slow = _verdicts(gold, response, reward_type)
    assert fast == slow == expected, why


def test_table_covers_enough_rows():
    assert len(ROWS) + len(RESPONSE_ROWS) >= 80
    assert {True, False} <= {row[2] for row in ROWS}


def test_fast_path_decides_the_plain_number_rows():
    # The fast/slow agreement above means something only if the fast path actually decided rows.
    decided = [(g, a) for g, a, _, _ in ROWS if (gn := plain_number(g)) and (an := plain_number(a))
               and numbers_verdict(gn, an) is not None]
    assert len(decided) >= 12, decided


def test_answers_that_cannot_equal_the_gold_skip_math_verify():
    # The agreement above means something only if the shortcut actually decided rows, and never a right one.
    def differs(gold, answer):
        return provably_different(parse_math(gold), parse_math(answer))

    assert differs("126", "14q9") and differs("126", "x^2+4") and differs("4\\pi", "4")
    assert differs("5\\sqrt{5}", "5") and differs("\\frac{1}{3}", "0.33") and differs("2^{10}", "1000")
    assert not differs("126", "x(x+1)-x^2-x+126")  # cancels to the number
    assert not differs("1", "\\sin^2 x + \\cos^2 x")  # not a polynomial
    assert not differs("\\frac{1}{3}", "0.333333")  # math-verify's 6-decimal rounding may call it equal
    assert not differs("10\\%", "10") and not differs("2^{10}", "1024") and not differs("x=5", "5")
    decided = [(g, a) for g, a, expected, _ in ROWS if (p := parse_math(g)) and (q := parse_math(a))
               and provably_different(p, q)]
    assert len(decided) >= 20, decided
    assert not [(g, a) for g, a in decided if (g, a, True) in {(r[0], r[1], r[2]) for r in ROWS}]
