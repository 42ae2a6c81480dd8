"""Math rewards: the answer is pulled out of a fixed format and checked with math-verify.

Two formats (``--reward-type``):
- ``boxed``: the last ``\\boxed{...}`` in the response (braces balanced) holds the answer.
- ``think_answer_tags``: the response is ``<think>...</think><answer>...</answer>`` (each tag exactly once,
  nothing but whitespace around them); the answer tag's content is the answer, with or without ``\\boxed``.

Equivalence is math-verify's (``1/2`` equals ``\\frac{1}{2}`` and ``0.5``), never string equality.
math-verify guards its parsing with ``signal.alarm``, which only works in the main thread; off the main
thread (threaded actors, thread pools) its own timeouts are turned off and the caller bounds the time.
"""

from __future__ import annotations

import re
import threading

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

from rewards.types import RewardResult, combine

_BOXED = "\\boxed{"
_THINK_ANSWER = re.compile(r"^\s*<think>(?P<think>.*?)</think>\s*<answer>(?P<answer>.*?)</answer>\s*$", re.DOTALL)
_TAGS = ("<think>", "</think>", "<answer>", "</answer>")


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


def extract_think_answer(text: str) -> str | None:
    """Content of ``<answer>`` when the response is exactly one think block then one answer block."""
    if any(text.count(tag) != 1 for tag in _TAGS):
        return None
    match = _THINK_ANSWER.match(text)
    return match.group("answer").strip() if match else None


def _timeouts() -> dict:
    if threading.current_thread() is threading.main_thread():
        return {}
    return {"parsing_timeout": None}


def _parse_answer(answer: str) -> list:
    configs = [LatexExtractionConfig(), ExprExtractionConfig()]
    parsed = parse(answer, extraction_config=configs, **_timeouts())
    if not parsed:  # bare LaTeX such as "\frac12" is only found inside math delimiters
        parsed = parse(f"${answer}$", extraction_config=configs, **_timeouts())
    return parsed


def answers_match(predicted: str, gold: str) -> bool:
    """True when math-verify finds the two answers equivalent."""
    gold_parsed = _parse_answer(gold)
    pred_parsed = _parse_answer(predicted)
    if not gold_parsed or not pred_parsed:
        return False
    verify_kwargs = {} if threading.current_thread() is threading.main_thread() else {"timeout_seconds": None}
    return bool(verify(gold_parsed, pred_parsed, **verify_kwargs))


def boxed_reward(response: str, gt_answer: str) -> RewardResult:
    answer = last_boxed(response)
    if answer is None:
        return RewardResult(0.0, False, False, None, "no \\boxed{} answer")
    correct = answers_match(f"\\boxed{{{answer}}}", gt_answer)
    return RewardResult(combine(True, float(correct)), correct, True, answer, "ok" if correct else "wrong answer")


def think_answer_reward(response: str, gt_answer: str) -> RewardResult:
    answer = extract_think_answer(response)
    if answer is None:
        return RewardResult(0.0, False, False, None, "not <think>...</think><answer>...</answer>")
    boxed = last_boxed(answer)
    candidate = f"\\boxed{{{boxed}}}" if boxed is not None else answer
    correct = answers_match(candidate, gt_answer)
    return RewardResult(combine(True, float(correct)), correct, True, answer, "ok" if correct else "wrong answer")
