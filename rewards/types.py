"""The result every reward function returns, shared by the math and code rewards."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

# A response in the right format earns this much even when its answer is wrong, so a policy that has not
# yet learned the format still gets a gradient towards it; a correct answer earns the full 1.0.
FORMAT_REWARD = 0.1


@dataclass(frozen=True)
class RewardResult:
    reward: float
    # the answer is right (for code: every test case passed); after combining, the run's verdict
    # (rewards/correctness.py), None when no reward of the run defines one
    correct: bool | None
    format_ok: bool  # the response has the shape the reward type asks for
    extracted: str | None  # the answer or program pulled out of the response, if any
    reason: str  # short human-readable cause, e.g. "ok", "wrong answer", "no \\boxed{}"
    # each weighted reward's own score (and its named parts) when several rewards are combined; else None
    parts: dict | None = None
    # ``reason``'s stable short form, counted over samples ("wrong answer" for "wrong answer on case 2"); None: the
    # reason itself is short
    cause: str | None = None

    @property
    def reason_code(self) -> str:
        return self.cause or self.reason


class Scored(NamedTuple):
    """One reward part's answer on one response: its score, named numbers for the logs, its own verdict (or None)."""
    score: float
    parts: dict
    correct: bool | None = None


def combine(format_ok: bool, score: float) -> float:
    """Reward from a format check and a score in [0, 1] (1 = fully correct).

    No format -> 0. Format but score 0 -> FORMAT_REWARD. Score 1 -> 1.0. Linear in between.
    """
    if not format_ok:
        return 0.0
    if not 0.0 <= score <= 1.0:
        raise ValueError(f"score must lie in [0, 1], got {score}")
    return FORMAT_REWARD + (1.0 - FORMAT_REWARD) * score


def regroup(flat: list, groups: list[list]) -> list[list]:
    """``flat`` (one item per response of ``groups``, in order) cut back into the groups' sizes."""
    out, start = [], 0
    for group in groups:
        out.append(flat[start:start + len(group)])
        start += len(group)
    return out


def example_label(example):
    """What ``example`` is scored against: its ``label`` (coati/dataset/rows.py ``Example``). An object of the
    older shape (``gt_answer`` for math, ``test_cases`` for code) is read by those names: the one place they map."""
    if hasattr(example, "label"):
        return example.label
    gold = getattr(example, "gt_answer", None)
    return gold if gold is not None else getattr(example, "test_cases", None)
