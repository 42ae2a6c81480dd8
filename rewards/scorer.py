"""Scoring a group of responses to one example, whatever the reward type."""

from __future__ import annotations

from rewards.math import MATH_FORMATS, GoldAnswer, score_group
from rewards.types import RewardResult


class RewardScorer:
    def __init__(self, reward_type: str, code_options: dict | None = None):
        if reward_type not in (*MATH_FORMATS, "code"):
            raise ValueError(f"unknown reward type {reward_type!r}; choose think_answer_tags, boxed or code")
        self.reward_type = reward_type
        self._code = None
        if reward_type == "code":
            from rewards.code import CodeRewardScorer

            self._code = CodeRewardScorer(**(code_options or {}))

    def score(self, responses: list[str], example) -> list[RewardResult]:
        """``example`` has ``gt_answer`` (math) or ``test_cases`` (code). The responses are usually one
        prompt's group: its gold answer is parsed once and each distinct answer checked once."""
        if self._code is not None:
            return self._code.score_batch(responses, [example.test_cases] * len(responses))
        return score_group(responses, GoldAnswer(example.gt_answer), self.reward_type)
