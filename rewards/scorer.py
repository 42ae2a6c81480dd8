"""Scoring a group of responses to one example, whatever the reward type."""

from __future__ import annotations

from rewards.math import boxed_reward, think_answer_reward
from rewards.types import RewardResult

_MATH = {"boxed": boxed_reward, "think_answer_tags": think_answer_reward}


class RewardScorer:
    def __init__(self, reward_type: str, code_options: dict | None = None):
        if reward_type not in (*_MATH, "code"):
            raise ValueError(f"unknown reward type {reward_type!r}; choose think_answer_tags, boxed or code")
        self.reward_type = reward_type
        self._code = None
        if reward_type == "code":
            from rewards.code import CodeRewardScorer

            self._code = CodeRewardScorer(**(code_options or {}))

    def score(self, responses: list[str], example) -> list[RewardResult]:
        """``example`` has ``gt_answer`` (math) or ``test_cases`` (code)."""
        if self._code is not None:
            return self._code.score_batch(responses, [example.test_cases] * len(responses))
        reward_fn = _MATH[self.reward_type]
        return [reward_fn(response, example.gt_answer) for response in responses]
