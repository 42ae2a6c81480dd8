"""A user reward that says what counts as correct: ``--reward-fn examples/rewards/closeness.py:closeness``.

Partial credit for a numeric answer near the label, so that a policy far from right still sees which samples
were closer; the response is *correct* only when its answer equals the label. Returning
``(score, {"correct": bool})`` makes that verdict the run's accuracy (eval lines, the final summary, rollout
logs, metrics.jsonl), whatever the built-in reward's weight:

    python rl_example.py --reward-fn examples/rewards/closeness.py:closeness --reward-weights boxed:0
"""

import re

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _number(text: str):
    try:
        return float(text)
    except ValueError:
        return None


def closeness(response: str, label, row: dict):
    """1 for the label's number, falling linearly to 0 at a relative error of 1; the last number in the
    response is its answer. A label that is no number: exact text match, no partial credit."""
    found = _NUMBER.findall(response)
    answer = found[-1] if found else None
    gold = _number(str(label).strip())
    if answer is None:
        return 0.0, {"correct": False}
    if gold is None:
        right = answer == str(label).strip()
        return float(right), {"correct": right}
    error = abs(float(answer) - gold)
    return max(0.0, 1.0 - error / max(1.0, abs(gold))), {"correct": error == 0, "abs_error": error}
