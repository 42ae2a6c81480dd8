"""The reward kinds (``-rt/--reward-type``): one ``RewardType`` row each, registered once in ``REWARD_TYPES``;
everything else asks the row (how its label is read, what it needs, its stop strings, prompt and verdict).

A kind is one file holding its scorer and its label reader (the math kinds: rewards/math.py, with their answer
formats; code: rewards/code/) and one row here, or, from a user's own code, one ``register_reward_type(row)``
(docs/rewards.md, Adding a reward kind). A kind's scorer is an object with

    score_groups(groups: list[list[str]], labels: list) -> list[list[RewardResult]]

one result per response of each group (a group: the responses to one example, whose label is ``labels[i]``);
how it batches them is its own affair (math: group by group; code: one sandbox batch over all groups).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

from rewards.code import CODE_SYSTEM_PROMPT, CodeRewardScorer, read_test_cases
from rewards.math import BOXED, THINK_ANSWER_TAGS, MathScorer, read_math_label
from rewards.prompts import BOXED_PROMPT, THINK_ANSWER_TAGS_PROMPT

LABEL_KEY = "label"  # the row field every kind reads its label from (older files: a kind's own label_key)


@dataclass(frozen=True)
class RewardType:
    name: str
    # builds the kind's scorer (``score_groups``, above); a kind that needs the sandbox gets its limits as keyword
    # arguments (coati/config/data.py CodeRewardConfig.scorer_options), any other is called with none
    scorer: Callable[..., Any]
    # (a row's label value, the field it came from) -> the label the scorer reads; a bad value raises ValueError
    # whose message says what is wrong (the loaders add file:line)
    read_label: Callable[[Any, str], Any]
    label_shape: str  # the label in words, for the line about a row that has none
    system_prompt: str  # the default: it tells the model the exact format the reward checks
    # a response in the format answering ``{answer}`` (the label), for the check call of user rewards at start-up;
    # braces of the text itself doubled, as str.format wants them
    sample_response: str
    # the field older files hold the label in (math: gt_answer, code: test_cases); ``label`` is read too, after it
    label_key: str = LABEL_KEY
    stop_strings: tuple[str, ...] = ()  # generation stops here; the text after it is never scored
    needs_sandbox: bool = False  # its scorer runs the response's code: the sandbox must work on this machine
    # its results' ``correct`` is a verdict that counts for accuracy (rewards/correctness.py, rule 3); False: a
    # graded kind, whose results say None and whose run's accuracy comes from another part or --correct-threshold
    verdict: bool = True
    embedded_demo: str | None = None  # the embedded demo a run without -m plays with it (None: none fits)

    @property
    def runs_code(self) -> bool:  # the older name of needs_sandbox
        return self.needs_sandbox

    @property
    def label_keys(self) -> tuple[str, ...]:
        """The fields a row's label is read from, first present wins: the kind's own, then ``label``."""
        return tuple(dict.fromkeys((self.label_key, LABEL_KEY)))

    def make_scorer(self, sandbox_options: dict | None = None):
        return self.scorer(**(sandbox_options or {})) if self.needs_sandbox else self.scorer()


# The row named by DEFAULT_REWARD_TYPE is what -rt defaults to.
_MATH_LABEL = 'the answer, a non-empty string such as "42", needed by math rewards'
REWARD_TYPES: dict[str, RewardType] = {spec.name: spec for spec in (
    RewardType("think_answer_tags", partial(MathScorer, THINK_ANSWER_TAGS), read_math_label, _MATH_LABEL,
               THINK_ANSWER_TAGS_PROMPT, "<think>check</think><answer>{answer}</answer>", label_key="gt_answer",
               stop_strings=("</answer>",)),
    RewardType("boxed", partial(MathScorer, BOXED), read_math_label, _MATH_LABEL, BOXED_PROMPT,
               "\\boxed{{{answer}}}", label_key="gt_answer", embedded_demo="addition"),
    RewardType("code", CodeRewardScorer, read_test_cases, "PRIME test cases", CODE_SYSTEM_PROMPT,
               "```python\nprint()\n```", label_key="test_cases", needs_sandbox=True, embedded_demo="code"),
)}

DEFAULT_REWARD_TYPE = "boxed"


def register_reward_type(row: RewardType) -> RewardType:
    """Add a kind (a user's own: from a --plugins file, or a script before it builds its run's config)."""
    from coati.utils.user_parts import note_row

    if row.name in REWARD_TYPES:
        raise ValueError(f"reward type {row.name!r} is already registered")
    REWARD_TYPES[row.name] = row
    note_row(f"{__name__}:REWARD_TYPES", "reward type", row.name, row, row.scorer)
    return row


def reward_type(name: str) -> RewardType:
    if name not in REWARD_TYPES:
        raise ValueError(f"unknown reward type {name!r}; choose one of {', '.join(REWARD_TYPES)}")
    return REWARD_TYPES[name]
