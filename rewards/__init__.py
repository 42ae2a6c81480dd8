"""Verifiable rewards: math (math.py: boxed, think/answer tags) and code (code/: programs run in a sandbox).

``rewards.scorer.RewardScorer`` is the entry point the producers, the learner and the evaluators use; the
reward kinds (their scorers, label readers, stop strings, default system prompts) are registered in
``rewards.builtin``, a user's own with ``register_reward_type``.
"""

from __future__ import annotations

from rewards.builtin import DEFAULT_REWARD_TYPE, REWARD_TYPES, RewardType, register_reward_type, reward_type
from rewards.types import FORMAT_REWARD, RewardResult, combine


def default_system_prompt(name: str) -> str:
    return reward_type(name).system_prompt


__all__ = ["DEFAULT_REWARD_TYPE", "FORMAT_REWARD", "REWARD_TYPES", "RewardResult", "RewardType", "combine",
           "default_system_prompt", "register_reward_type", "reward_type"]
