"""Verifiable rewards: math (math.py: boxed, think/answer tags) and code (code.py: programs run in a sandbox).

``rewards.scorer.RewardScorer`` is the entry point the producers, the learner and the evaluators use; this
package names the reward types, their stop strings and their default system prompts.
"""

from __future__ import annotations

from rewards.math import boxed_reward, think_answer_reward
from rewards.prompts import BOXED_PROMPT, THINK_ANSWER_TAGS_PROMPT
from rewards.types import FORMAT_REWARD, RewardResult, combine

REWARD_TYPES = ("think_answer_tags", "boxed", "code")

# Generation stops here for each reward type; the text after it is never scored anyway.
STOP_STRINGS = {"think_answer_tags": ("</answer>",), "boxed": (), "code": ()}

MATH_REWARDS = {"boxed": boxed_reward, "think_answer_tags": think_answer_reward}


def default_system_prompt(reward_type: str) -> str:
    if reward_type == "code":
        from rewards.code import CODE_SYSTEM_PROMPT

        return CODE_SYSTEM_PROMPT
    return {"boxed": BOXED_PROMPT, "think_answer_tags": THINK_ANSWER_TAGS_PROMPT}[reward_type]


__all__ = ["FORMAT_REWARD", "MATH_REWARDS", "REWARD_TYPES", "STOP_STRINGS", "RewardResult", "combine",
           "default_system_prompt"]
