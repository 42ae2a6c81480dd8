"""Math rewards: the answer is pulled out of a fixed format and checked with math-verify.

Two formats (``--reward-type``):
- ``boxed``: the last ``\\boxed{...}`` in the response (braces balanced) holds the answer. When boxes right
  before it are joined to it only by a listing (``\\boxed{-2} \\text{ and } \\boxed{1}``: commas, "and",
  "or", spacing, ``$``), they are all the answer (``final_boxes``): for a gold of several values (a list or
  set, ``1, -2``) read together as that set, order-free; for a one-value gold every one of them must be right,
  so listing several candidates never wins. A gold of several values is also matched by the boxes math-verify
  reads as one answer's parts (``answer_parts``: near each other, or joined by "and", "or", "," or ";"), so
  parts given apart (``\\boxed{(3, 3)} \\text{ for part (a) and } \\boxed{(1, 1)}``) count; a one-value gold
  keeps the last-box rule.
- ``think_answer_tags``: the response is ``<think>...</think><answer>...</answer>`` (each tag exactly once,
  nothing but whitespace around them); the answer tag's content is the answer, with or without ``\\boxed``.

Equivalence is math-verify's (``1/2`` equals ``\\frac{1}{2}`` and ``0.5``), never string equality.

The math kinds of rewards/builtin.py: ``MathScorer`` (one per format) scores groups; ``read_math_label`` reads a
row's label (``final_answer``: a GSM8K or MATH solution gives its final answer).

Reading an answer: gold answers (``gt_answer``) and the model's answers are read the same way, as LaTeX the
way MATH's own answers are written: the last ``\\boxed{}`` when the text has one (a gold whose last boxes are
several parts, ``\\boxed{1}\\boxed{2}``, is the list of them), the delimited math when it
has ``$...$``, ``\\(...\\)`` or ``\\[...\\]``, else the whole text as if it stood in a box. Only when that
finds nothing does math-verify's plain-text extraction get a go. Reading bare text with the plain-text
extractor first would take a prefix: "4" of ``4\\pi``, "3" of ``3\\sqrt{2}``.

Speed: a group of G answers to one prompt parses its gold once (``GoldAnswer``), scores each distinct answer
once (``score_group``), and compares plain decimal numbers exactly without sympy (``numbers_verdict``),
leaving math-verify everything else and the few number pairs its 6-decimal rounding might call equal; parsed
answers that cannot equal the gold (numbers far apart, a non-constant polynomial against a number) are wrong
without math-verify's costly simplification (``provably_different``); an answer written exactly as the gold
is gets the gold's verdict against itself, computed once;
math-verify's LaTeX parser runs in ANTLR's two-stage mode (``rewards/latex_parsing.py``).

math-verify guards its parsing with ``signal.alarm``, which only works in the main thread; off the main
thread (threaded actors, thread pools) its own timeouts are turned off and the caller bounds the time.
"""

from __future__ import annotations

import re
import threading
from fractions import Fraction
from typing import Callable, NamedTuple

from rewards.types import RewardResult, combine

_BOXED = "\\boxed{"
# What may stand between the boxes of one listed answer: math delimiters, spacing, punctuation, and/or.
_TEXT_COMMAND = re.compile(r"\\(?:text|textbf|mathrm|mbox)\s*\{([^{}]*)\}")
_LIST_MARKUP = re.compile(r"\$|\\[()\[\]\\]|\\(?:quad|qquad|[,;:! ])|~|[,;.&]|\b[A-Za-z]\s*=")
_LIST_WORDS = re.compile(r"\b(?:and|or)\b")
# What math-verify accepts between the boxes of one answer of several parts (see ``answer_parts``).
_PART_SEPARATOR = re.compile(r"\b(?:and|or)\b|[,;]")
_THINK_ANSWER = re.compile(r"^\s*<think>(?P<think>.*?)</think>\s*<answer>(?P<answer>.*?)</answer>\s*$", re.DOTALL)
_TAGS = ("<think>", "</think>", "<answer>", "</answer>")
# An unescaped $ (``\$`` is a dollar sign), or \( or \[: the text marks its own math.
_MATH_DELIMITER = re.compile(r"(?<!\\)\$|\\\(|\\\[")
# A full stop ending the answer ends a sentence ("\boxed{5.}"); LaTeX that ends in one fails to parse.
_SENTENCE_END = re.compile(r"\.\s*$")
# An integer (optionally with thousands commas, as GSM8K writes them) or a decimal, optionally negative.
_PLAIN_NUMBER = re.compile(r"-?(?:[1-9]\d{0,2}(?:,\d{3})+|\d+)(?:\.\d+)?")
# math-verify rounds to 6 decimals when a decimal is involved (``verify(float_rounding=6)``): two numbers
# further apart than this can never round to the same value; closer ones are left to math-verify.
_ROUNDING_GAP = Fraction(1, 10**6)


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` with balanced braces, or None."""
    start = text.rfind(_BOXED)
    while start != -1:
        depth, i = 1, start + len(_BOXED)
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            return text[start + len(_BOXED) : i - 1]
        start = text.rfind(_BOXED, 0, start)
    return None


def _top_level_boxes(text: str) -> list[tuple[int, int, str]]:
    """(start, end, content) of each top-level ``\\boxed{...}``, in order; an unclosed box ends the scan."""
    boxes, start = [], text.find(_BOXED)
    while start != -1:
        depth, i = 1, start + len(_BOXED)
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth:
            break
        boxes.append((start, i, text[start + len(_BOXED) : i - 1]))
        start = text.find(_BOXED, i)
    return boxes


def _joins_boxes(between: str) -> bool:
    """The text between two boxes only lists them (``, ``, `` and ``, ``$ or $``, ``\\quad\\text{and}\\quad``)."""
    words = _LIST_MARKUP.sub(" ", _TEXT_COMMAND.sub(r" \1 ", between)).lower()
    return not _LIST_WORDS.sub(" ", words).strip()


def final_boxes(text: str) -> list[str]:
    """The final answer's boxes: the last ``\\boxed{}`` and the boxes right before it that only a listing joins
    to it (``\\boxed{-2} \\text{ and } \\boxed{1}``), each distinct content once, in order. A box that
    reasoning separates from the next ("First \\boxed{3}, but checking again ... \\boxed{4}") is not part of it."""
    boxes = _top_level_boxes(text)
    if not boxes:
        return []
    run = [boxes[-1]]
    for box in reversed(boxes[:-1]):
        if not _joins_boxes(text[box[1] : run[0][0]]):
            break
        run.insert(0, box)
    return list(dict.fromkeys(content for _, _, content in run))


def answer_parts(text: str) -> list[str]:
    """The boxes math-verify reads as the parts of one answer: the last box and, going back from it, each box
    separated from the next part by fewer than 10 characters, or by fewer than 70 among which is "and", "or", a
    comma or a semicolon (``\\boxed{1} papers and \\boxed{2} bins``). Each distinct content once, in order."""
    boxes = _top_level_boxes(text)
    if not boxes:
        return []
    run = [boxes[-1]]
    for box in reversed(boxes[:-1]):
        between = text[box[1] : run[0][0]]
        if len(between) >= 10 and (len(between) >= 70 or not _PART_SEPARATOR.search(between)):
            break
        run.insert(0, box)
    return list(dict.fromkeys(content for _, _, content in run))


def extract_think_answer(text: str) -> str | None:
    """Content of ``<answer>`` when the response is exactly one think block then one answer block."""
    if any(text.count(tag) != 1 for tag in _TAGS):
        return None
    match = _THINK_ANSWER.match(text)
    return match.group("answer").strip() if match else None


class PlainNumber(NamedTuple):
    value: Fraction
    decimal: bool  # written with a decimal point: math-verify then compares rounded floats


def plain_number(text: str) -> PlainNumber | None:
    """The number an answer is when it is nothing but a plain decimal number (``1,234``, ``-0.5``)."""
    boxed = last_boxed(text)
    text = (text if boxed is None else boxed).strip()
    if not _PLAIN_NUMBER.fullmatch(text):
        return None
    return PlainNumber(Fraction(text.replace(",", "")), "." in text)


def numbers_verdict(gold: PlainNumber, answer: PlainNumber) -> bool | None:
    """math-verify's verdict on two plain numbers, computed exactly; None where only its rounding can tell."""
    if gold.value == answer.value:
        return True
    if not (gold.decimal or answer.decimal):
        return False  # two integers: math-verify compares them exactly
    gap = abs(gold.value - answer.value)
    # the relative bound keeps the verdict safe from sympy's 15-digit floats on huge numbers
    if gap > _ROUNDING_GAP and gap > max(abs(gold.value), abs(answer.value)) / 10**9:
        return False
    return None


def _plain_expression(item) -> bool:
    """A sympy expression without free symbols or percentages (math-verify compares ``9%`` with ``9``)."""
    import sympy

    return isinstance(item, sympy.Expr) and not item.free_symbols and not item.has(sympy.UnevaluatedExpr)


def _expressions_differ(gold, answer) -> bool:
    """True only when math-verify's comparison of the two expressions is certainly False."""
    import sympy

    if not _plain_expression(gold) or not isinstance(answer, sympy.Expr) or answer.has(sympy.UnevaluatedExpr):
        return False
    if answer.free_symbols:
        # a polynomial in free symbols that is not constant (``14q9`` -> 126*q) equals no number: math-verify's
        # structural, numeric and simplified comparisons all fail
        symbols = sorted(answer.free_symbols, key=str)
        return answer.is_polynomial(*symbols) and not sympy.Poly(answer, *symbols).is_ground
    # two numbers: math-verify rounds floats to 6 decimals and evaluates the rest (symbolically at worst);
    # values further apart than rounding or 15-digit floats can bridge are different for it too
    gap = sympy.Abs((gold - answer).evalf(30))
    scale = sympy.Max(sympy.Abs(gold.evalf(30)), sympy.Abs(answer.evalf(30)))
    if not (gap.is_Number and scale.is_Number and gap.is_finite and scale.is_finite):
        return False
    return bool(gap > sympy.Float("1e-6") and gap > scale * sympy.Float("1e-9"))


def provably_different(parsed_gold: list, parsed_answer: list) -> bool:
    """True when math-verify's ``verify`` of the two parses is certainly False, decided in a few ms where its
    own ``simplify`` takes 0.1-3 s: every pair it would compare is two different strings, a string and an
    expression (never equal for it), or two expressions that ``_expressions_differ``. False means "ask
    math-verify", never "equal"."""
    for gold in parsed_gold:
        for answer in parsed_answer:
            if isinstance(gold, str) and isinstance(answer, str):
                if gold.strip() and gold.strip() == answer.strip():
                    return False
            elif isinstance(gold, str) or isinstance(answer, str):
                continue
            else:
                try:
                    if not _expressions_differ(gold, answer):
                        return False
                except Exception:  # sympy could not tell: math-verify decides
                    return False
    return True


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


class _MathVerify(NamedTuple):
    parse: Callable
    verify: Callable
    latex: tuple  # the box is matched first, as math-verify's own MATH tasks read their gold answers
    latex_or_expression: tuple


_math_verify_lock = threading.Lock()
_math_verify_loaded: list[_MathVerify] = []


def _math_verify() -> _MathVerify:
    """math-verify with its LaTeX parser (sympy, ANTLR), imported at the first answer that needs it: about a
    second of CPU that the driver, the trainer ranks and plain-number tasks (the addition demo) never spend."""
    with _math_verify_lock:
        if not _math_verify_loaded:
            from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

            from rewards.latex_parsing import enable_two_stage_parsing

            enable_two_stage_parsing()  # same parses, several times faster (see rewards/latex_parsing.py)
            _math_verify_loaded.append(_MathVerify(parse, verify, (LatexExtractionConfig(boxed_match_priority=0),),
                                                   (LatexExtractionConfig(), ExprExtractionConfig())))
        return _math_verify_loaded[0]


def parse_math(text: str) -> list:
    """math-verify's parse of an answer (gold or model's), read as LaTeX first; see the module docstring."""
    timeouts = {} if _in_main_thread() else {"parsing_timeout": None}
    boxed = last_boxed(text)
    if boxed is None and _MATH_DELIMITER.search(text):
        source = text
    else:
        source = f"\\boxed{{{_SENTENCE_END.sub('', text if boxed is None else boxed)}}}"
    math_verify = _math_verify()
    parsed = math_verify.parse(source, extraction_config=math_verify.latex, **timeouts)
    if not parsed:  # e.g. unbalanced braces
        parsed = math_verify.parse(text, extraction_config=math_verify.latex_or_expression, **timeouts)
    return parsed


class GoldAnswer:
    """A reference answer read once and compared with many answers. ``fast_path=False`` sends every
    comparison through math-verify (the table test checks that both ways agree)."""

    def __init__(self, text: str, fast_path: bool = True):
        self.text = text
        parts = answer_parts(text) if text.count(_BOXED) > 1 else []
        # a gold of several boxes (``\\boxed{1}\\boxed{2}``, ``\\boxed{1} papers and \\boxed{2} bins``) is their list
        self.reading = ", ".join(parts) if len(parts) > 1 else text
        self.fast_path = fast_path
        self.number = plain_number(self.reading) if fast_path else None
        self._parsed: list | None = None  # parsed on first need: plain-number groups may never need it
        self._self_match: bool | None = None  # math-verify's verdict on the gold's own text as an answer

    @property
    def parsed(self) -> list:
        if self._parsed is None:
            self._parsed = parse_math(self.reading)
        return self._parsed

    @property
    def several(self) -> bool:
        """The gold is a list or set of several values (``1, -2``, ``(2, 2), (6, 2)``, ``\\{1, 2\\}``), which
        math-verify reads as a finite set: order-free."""
        if self.number is not None:
            return False
        import sympy

        return bool(self.parsed) and isinstance(self.parsed[0], sympy.FiniteSet) and len(self.parsed[0]) > 1

    def matches_boxes(self, boxes: list[str]) -> bool:
        """A final answer of several different boxes: for a gold of several values they are read together, as
        that list or set; for a one-value gold every box must be right (listing candidates must never win)."""
        if self.several:
            return self.matches(", ".join(boxes))
        return all(self.matches(box) for box in boxes)

    def _verify(self, answer_parsed: list) -> bool:
        verify_kwargs = {} if _in_main_thread() else {"timeout_seconds": None}
        # gold first: verify is asymmetric
        return bool(_math_verify().verify(self.parsed, answer_parsed, **verify_kwargs))

    def matches(self, answer: str) -> bool:
        if not answer.strip():
            return False  # math-verify finds nothing in an empty answer; no need to ask it
        if self.number is not None and (number := plain_number(answer)) is not None:
            verdict = numbers_verdict(self.number, number)
            if verdict is not None:
                return verdict
        if self.fast_path and answer == self.reading:
            # the same text parses the same: math-verify's verdict is the gold's against itself, asked once
            if self._self_match is None:
                self._self_match = bool(self.parsed) and self._verify(self.parsed)
            return self._self_match
        if not self.parsed:
            return False
        answer_parsed = parse_math(answer)
        if not answer_parsed:
            return False
        if self.fast_path and provably_different(self.parsed, answer_parsed):
            return False
        return self._verify(answer_parsed)


def answers_match(answer: str, gold: str, fast_path: bool = True) -> bool:
    """True when math-verify finds the two answers equivalent."""
    return GoldAnswer(gold, fast_path).matches(answer)


class MathFormat(NamedTuple):
    """Where a response holds its answer: ``extract`` pulls it out (None: not in the format, ``missing`` says
    why); ``boxes_in_response``: several boxes are looked for in the whole response, else in the answer."""

    name: str
    extract: Callable[[str], str | None]
    missing: str
    boxes_in_response: bool


BOXED = MathFormat("boxed", last_boxed, "no \\boxed{} answer", boxes_in_response=True)
THINK_ANSWER_TAGS = MathFormat("think_answer_tags", extract_think_answer, "not <think>...</think><answer>...</answer>",
                               boxes_in_response=False)
MATH_FORMATS = {fmt.name: fmt for fmt in (BOXED, THINK_ANSWER_TAGS)}


def _verdict(gold: GoldAnswer, answer: str, final: list[str], parts: list[str]) -> RewardResult:
    """The answer is the final listed boxes (``final``, when several) or else the extracted ``answer``. A gold of
    several values is also matched by the parts math-verify reads together (``parts``, see ``answer_parts``),
    so parts given apart ("\\boxed{(3, 3)} for part (a) and \\boxed{(1, 1)}") count; ``parts`` is empty for a
    one-value gold, which keeps the last-box rule."""
    readings = [final if len(final) > 1 else [answer]]
    if len(parts) > 1 and parts != readings[0]:
        readings.append(parts)
    for reading in readings:
        if gold.matches_boxes(reading) if len(reading) > 1 else gold.matches(reading[0]):
            return RewardResult(combine(True, 1.0), True, True, ", ".join(reading), "ok")
    return RewardResult(combine(True, 0.0), False, True, ", ".join(readings[0]), "wrong answer")


def score_group(responses: list[str], gold: GoldAnswer, fmt: MathFormat | str) -> list[RewardResult]:
    """One result per response; each distinct answer of the group is checked once. A response (boxed) or an
    answer tag (think_answer_tags) with several boxes is checked by ``_verdict``. ``fmt``: the format, or its
    name."""
    if isinstance(fmt, str):
        fmt = MATH_FORMATS[fmt]
    extract, format_reason = fmt.extract, fmt.missing
    by_answer: dict[str | tuple, RewardResult] = {}
    results = []
    for response in responses:
        answer = extract(response)
        if answer is None:
            results.append(RewardResult(0.0, False, False, None, format_reason))
            continue
        source = response if fmt.boxes_in_response else answer
        several_boxes = source.count(_BOXED) > 1
        final = final_boxes(source) if several_boxes else []
        parts = answer_parts(source) if several_boxes and gold.several else []
        key = (answer, tuple(final), tuple(parts)) if several_boxes else answer
        if key not in by_answer:
            by_answer[key] = _verdict(gold, answer, final, parts)
        results.append(by_answer[key])
    return results


class MathScorer:
    """The math kinds' scorer (``boxed``, ``think_answer_tags``: one ``MathFormat`` each): a group's gold answer
    is read once and each distinct answer checked once (``score_group``), group by group."""

    def __init__(self, fmt: MathFormat):
        self.fmt = fmt

    def score_groups(self, groups: list[list[str]], labels: list[str]) -> list[list[RewardResult]]:
        return [score_group(responses, GoldAnswer(label), self.fmt) for responses, label in zip(groups, labels)]


_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")  # a comma between digit groups, as in "1,000,000"


def final_answer(label) -> str:
    """The gold answer a math label stands for.

    ``"... #### 1,080"`` (GSM8K) -> ``"1080"``: the text after the last ``####``, thousands separators dropped.
    Else a label holding ``\\boxed{...}`` (a MATH solution) -> the last box's content, or the contents of the
    listed boxes it ends with, joined by ", " (``\\boxed{1}$ and $\\boxed{-2}`` -> ``1, -2``). Else the label itself,
    stripped; numbers become their string.
    """
    if isinstance(label, bool) or not isinstance(label, (str, int, float)):
        raise ValueError(f"must be a string or a number, got {type(label).__name__}")
    if not isinstance(label, str):
        return str(label)
    if "####" in label:
        answer = _THOUSANDS.sub("", label.rsplit("####", 1)[1].strip())
    else:
        boxes = final_boxes(label)  # several listed boxes ("\boxed{1} and \boxed{-2}") are one list answer
        answer = (", ".join(boxes) if boxes else label).strip()
    if not answer:
        raise ValueError("holds no answer (empty, or nothing after '####' or inside \\boxed{})")
    return answer


def read_math_label(value, key: str) -> str:
    """A row's math label (a plain answer, a GSM8K or MATH solution) -> its gold answer; the error names ``key``."""
    try:
        return final_answer(value)
    except ValueError as err:
        raise ValueError(f'"{key}" {err}') from None


def boxed_reward(response: str, gt_answer: str) -> RewardResult:
    return score_group([response], GoldAnswer(gt_answer), BOXED)[0]


def think_answer_reward(response: str, gt_answer: str) -> RewardResult:
    return score_group([response], GoldAnswer(gt_answer), THINK_ANSWER_TAGS)[0]
