"""A reward kind of your own: the answer after "Answer:" must equal the row's label exactly (spaces around it aside).

One file and one registration: pass it as ``--plugins examples/rewards/exact_string_kind.py`` (or import it in
the script that calls ``coati.run``) and train or evaluate with ``-rt exact_string``; rows carry the expected
text as ``{"messages": ..., "label": "Paris"}`` (docs/rewards.md, Adding a reward kind).
"""

from rewards.builtin import RewardType, register_reward_type
from rewards.types import RewardResult, combine

PREFIX = "Answer:"


def read_label(value, key: str) -> str:
    """A row's label: a non-empty string (a bad one raises ValueError naming its field; the loader adds file:line)."""
    if not isinstance(value, str):
        raise ValueError(f'"{key}" must be a string, got {type(value).__name__}')
    return value.strip()


class ExactString:
    """The kind's scorer: a response without "Answer:" lacks the format (0), a wrong text earns the format's 0.1,
    the label's text 1.0."""

    def score_groups(self, groups: list[list[str]], labels: list[str]) -> list[list[RewardResult]]:
        return [[self.score(response, label) for response in responses] for responses, label in zip(groups, labels)]

    @staticmethod
    def score(response: str, label: str) -> RewardResult:
        if PREFIX not in response:
            return RewardResult(combine(False, 0.0), False, False, None, f"no {PREFIX}")
        answer = response.rsplit(PREFIX, 1)[1].strip()
        right = answer == label
        return RewardResult(combine(True, float(right)), right, True, answer, "ok" if right else "wrong answer")


register_reward_type(RewardType(
    name="exact_string", scorer=ExactString, read_label=read_label, label_shape="the expected text, a non-empty string",
    system_prompt=f"Reply with one line: {PREFIX} followed by the answer.", sample_response=f"{PREFIX} {{answer}}",
    stop_strings=("\n",)))
