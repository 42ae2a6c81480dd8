"""Scoring a group of responses to one example, whatever the reward type."""

from __future__ import annotations

from rewards.builtin import reward_type as reward_type_spec
from rewards.combine import CombinedRewards
from rewards.math import GoldAnswer, score_group
from rewards.types import RewardResult


class RewardScorer:
    """The built-in reward of ``reward_type``, weighted with the user's functions (``reward_fns``: specs
    ``path.py:name``) and a reward server (``reward_url``) when given; see rewards/combine.py."""

    def __init__(self, reward_type: str, code_options: dict | None = None, reward_fns=(),
                 reward_url: str | None = None, reward_weights: str | None = None,
                 remote_options: dict | None = None, correct_threshold: float | None = None):
        self.spec = reward_type_spec(reward_type)
        self.reward_type = reward_type
        self.combined = CombinedRewards(reward_type, reward_fns, reward_url, reward_weights, remote_options,
                                        correct_threshold)
        self._code = None
        if self.spec.runs_code:
            from rewards.code import CodeRewardScorer

            self._code = CodeRewardScorer(**(code_options or {}))

    def score(self, responses: list[str], example) -> list[RewardResult]:
        return self.combined.apply(self._builtin(responses, example), responses, [example] * len(responses))

    def _builtin(self, responses: list[str], example) -> list[RewardResult]:
        """``example`` has ``gt_answer`` (math) or ``test_cases`` (code). The responses are usually one
        prompt's group: its gold answer is parsed once and each distinct answer checked once."""
        if self._code is not None:
            return self._code.score_batch(responses, [example.test_cases] * len(responses))
        return score_group(responses, GoldAnswer(example.gt_answer), self.spec.math_format)

    def score_groups(self, groups: list[list[str]], examples) -> list[list[RewardResult]]:
        """Each example's group of responses (a generation round). Code: one batch over all groups, so the
        sandbox workers stay busy across groups instead of waiting at the end of each; math: group by group."""
        if len(groups) != len(examples):
            raise ValueError(f"{len(groups)} groups but {len(examples)} examples")
        flat_responses = [r for responses in groups for r in responses]
        flat_examples = [example for responses, example in zip(groups, examples) for _ in responses]
        if self._code is None:
            flat = [r for responses, example in zip(groups, examples) for r in self._builtin(responses, example)]
        else:
            flat = self._code.score_batch(flat_responses, [example.test_cases for example in flat_examples])
        flat = self.combined.apply(flat, flat_responses, flat_examples)  # one batch for a reward server
        bounds = [0]
        for responses in groups:
            bounds.append(bounds[-1] + len(responses))
        return [flat[a:b] for a, b in zip(bounds, bounds[1:])]

    def score_each(self, responses: list[str], examples) -> list[RewardResult]:
        """One response per example (an evaluation): code responses run in parallel on all sandbox workers."""
        if len(responses) != len(examples):
            raise ValueError(f"{len(responses)} responses but {len(examples)} examples")
        if self._code is not None:
            results = self._code.score_batch(responses, [example.test_cases for example in examples])
        else:
            results = [self._builtin([response], example)[0] for response, example in zip(responses, examples)]
        return self.combined.apply(results, responses, list(examples))
