"""Scoring a group of responses to one example, whatever the reward kind."""

from __future__ import annotations

import dataclasses

from rewards.builtin import reward_type as reward_type_spec
from rewards.combine import CombinedRewards
from rewards.types import RewardResult, example_label, regroup


class RewardScorer:
    """The built-in reward of ``reward_type`` (its kind's scorer, rewards/builtin.py), weighted with the user's
    functions (``reward_fns``: specs ``path.py:name``) and a reward server (``reward_url``) when given; see
    rewards/combine.py. ``code_options``: the sandbox's limits, for a kind that needs the sandbox."""

    def __init__(self, reward_type: str, code_options: dict | None = None, reward_fns=(),
                 reward_url: str | None = None, reward_weights: str | None = None,
                 remote_options: dict | None = None, correct_threshold: float | None = None):
        self.spec = reward_type_spec(reward_type)
        self.reward_type = reward_type
        self.combined = CombinedRewards(reward_type, reward_fns, reward_url, reward_weights, remote_options,
                                        correct_threshold)
        self.kind = self.spec.make_scorer(code_options)

    def score(self, responses: list[str], example) -> list[RewardResult]:
        """One example's group of responses (its label is read once; each distinct answer checked once)."""
        return self.score_groups([responses], [example])[0]

    def _builtin(self, groups: list[list[str]], examples) -> list[RewardResult]:
        """The kind's results, flat; a kind without a verdict says none (rewards/correctness.py)."""
        flat = [r for results in self.kind.score_groups(groups, [example_label(e) for e in examples])
                for r in results]
        return flat if self.spec.verdict else [dataclasses.replace(r, correct=None) for r in flat]

    def score_groups(self, groups: list[list[str]], examples) -> list[list[RewardResult]]:
        """Each example's group of responses (a generation round), batched as the kind batches them."""
        if len(groups) != len(examples):
            raise ValueError(f"{len(groups)} groups but {len(examples)} examples")
        flat_responses = [r for responses in groups for r in responses]
        flat_examples = [example for responses, example in zip(groups, examples) for _ in responses]
        # one batch for a reward server
        flat = self.combined.apply(self._builtin(groups, examples), flat_responses, flat_examples)
        return regroup(flat, groups)

    def score_each(self, responses: list[str], examples) -> list[RewardResult]:
        """One response per example (an evaluation): a group of one each."""
        if len(responses) != len(examples):
            raise ValueError(f"{len(responses)} responses but {len(examples)} examples")
        return [r for results in self.score_groups([[r] for r in responses], examples) for r in results]
