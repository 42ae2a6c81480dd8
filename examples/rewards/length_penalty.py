"""A user reward for ``--reward-fn examples/rewards/length_penalty.py:length_penalty``.

Penalises long responses, a little per character beyond a budget, so that with the built-in reward
(``--reward-weights boxed:1,length_penalty:0.5``) a right short answer beats a right rambling one.
"""

BUDGET = 64  # characters allowed for free
PER_CHAR = 0.002  # penalty per character beyond the budget
FLOOR = -1.0


def length_penalty(response: str, label, row: dict):
    """0 within the budget, then down to -1; the parts go to the rollout and eval logs."""
    over = max(0, len(response) - BUDGET)
    penalty = max(FLOOR, -PER_CHAR * over)
    return penalty, {"chars": float(len(response))}


def exact_label(response: str, label, row: dict) -> float:
    """1 when the row's label appears verbatim in the response (a crude, format-free check)."""
    return 1.0 if str(label) in response else 0.0
