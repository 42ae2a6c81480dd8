"""What counts as a correct response in a run, and its accuracy: the one rule every scorer and report uses.

A sample's verdict, first that applies:

1. parts that say so: a ``--reward-fn`` that returns ``(score, {"correct": bool, ...})`` or a reward server
   that replies ``"correct"``: correct when every part that gave a verdict says True;
2. ``--correct-threshold T``: correct when the weighted reward is >= T;
3. the built-in ``-rt`` reward's verdict, while its weight is not 0 and its kind gives verdicts
   (``RewardType.verdict``, rewards/builtin.py);
4. otherwise none: the run's rewards define no correctness (the built-in reward weighted 0 and nothing else says),
   and its accuracy is "not defined"; reports give the mean reward instead.

Accuracy is the share of correct samples among those with a verdict (None when no sample has one).
"""

from __future__ import annotations

from typing import Iterable, Sequence

CORRECT_KEY = "correct"  # the key of a reward part's verdict, in a function's dict or a server's reply
NOT_DEFINED = "not defined"


def sample_correct(builtin_correct: bool | None, builtin_weight: float, verdicts: Sequence[bool], reward: float,
                   threshold: float | None) -> bool | None:
    """One sample's verdict: ``verdicts`` are the parts' own (user functions, server), ``reward`` the weighted sum."""
    if verdicts:
        return all(verdicts)
    if threshold is not None:
        return reward >= threshold
    if builtin_weight != 0 and builtin_correct is not None:  # None: a graded kind (RewardType.verdict False)
        return bool(builtin_correct)
    return None


def is_verdict(value) -> bool:
    """True or False (numpy's bool too): what a part may return as its ``"correct"``."""
    return isinstance(value, bool) or type(value).__name__ == "bool_" and type(value).__module__ == "numpy"


def accuracy(verdicts: Iterable[bool | None]) -> float | None:
    """The share of True among the samples with a verdict; None when none has one."""
    defined = [bool(v) for v in verdicts if v is not None]
    return sum(defined) / len(defined) if defined else None


def accuracy_text(value: float | None) -> str:
    return NOT_DEFINED if value is None else f"{value:.3f}"
