"""The built-in reward types (``-rt/--reward-type``): one ``RewardType`` each, registered once in
``REWARD_TYPES``; everything else asks the spec (its label key, stop strings, prompt, whether it runs code)."""

from __future__ import annotations

from dataclasses import dataclass

from rewards.code.prompts import CODE_SYSTEM_PROMPT
from rewards.math import BOXED, THINK_ANSWER_TAGS, MathFormat
from rewards.prompts import BOXED_PROMPT, THINK_ANSWER_TAGS_PROMPT


@dataclass(frozen=True)
class RewardType:
    name: str
    system_prompt: str  # the default: it tells the model the exact format the reward checks
    sample_response: str  # a response in the format answering ``{answer}`` (the check call of user rewards)
    label_key: str = "gt_answer"  # the row field that holds the label
    stop_strings: tuple[str, ...] = ()  # generation stops here; the text after it is never scored
    math_format: MathFormat | None = None  # math: where a response holds its answer (checked by math-verify)
    runs_code: bool = False  # code: the label is test cases, run against the response in the sandbox
    embedded_demo: str | None = None  # the embedded demo a run without -m plays with it (None: none fits)


# The row named by DEFAULT_REWARD_TYPE is what -rt defaults to.
REWARD_TYPES: dict[str, RewardType] = {spec.name: spec for spec in (
    RewardType("think_answer_tags", THINK_ANSWER_TAGS_PROMPT, "<think>check</think><answer>{answer}</answer>",
               stop_strings=("</answer>",), math_format=THINK_ANSWER_TAGS),
    RewardType("boxed", BOXED_PROMPT, "\\boxed{{{answer}}}", math_format=BOXED, embedded_demo="addition"),
    RewardType("code", CODE_SYSTEM_PROMPT, "```python\nprint()\n```", label_key="test_cases", runs_code=True,
               embedded_demo="code"),
)}

DEFAULT_REWARD_TYPE = "boxed"


def reward_type(name: str) -> RewardType:
    if name not in REWARD_TYPES:
        raise ValueError(f"unknown reward type {name!r}; choose one of {', '.join(REWARD_TYPES)}")
    return REWARD_TYPES[name]
