"""One dataset row -> one ``Example``: which field is the prompt, which the label, and what they may look like.

``RowFormat`` names the fields (OpenRLHF's ``--input-key`` / ``--label-key``). The prompt field may hold a
plain string (the user's message), one role/content object, or a chat list of them ending with the user's
turn. The label is whatever the reward kind (``-rt``, rewards/builtin.py) scores against, read by the kind's own
``read_label``: for math rewards the gold answer or a worked solution that ends in one (GSM8K's ``"... #### 72"``
gives ``72`` and MATH's ``"... \\boxed{\\frac{1}{2}}."`` gives ``\\frac{1}{2}``, rewards/math.py ``final_answer``);
for ``-rt code``, PRIME test cases (an object, or that object as a JSON string). Without ``--label-key`` a row
holds it under ``label``, or under the kind's older name (``gt_answer`` for math, ``test_cases`` for code), which
wins when both are there (``RowFormat.row_label``: the one place the names map).

Every problem raises ``ValueError`` with a message that the loaders prefix with ``file:line`` or ``file:row``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rewards import DEFAULT_REWARD_TYPE, reward_type
from rewards.math import final_answer  # noqa: F401  (callers found it here before it moved to its kind)

ROLES = ("system", "user", "assistant")


class DatasetError(ValueError):
    """A dataset file is missing or malformed; the message names the file, the line or row, and the fix."""


@dataclass(frozen=True, init=False)
class Example:
    messages: tuple[dict, ...]  # role/content dicts, in order
    label: Any = None  # what the reward kind scores against (a gold answer, test cases...); None: no answer
    source: str = ""  # "file:line" or "file:row N", for messages about this example
    row: dict | None = field(default=None, compare=False, repr=False)  # the whole row, for --reward-fn

    def __init__(self, messages, label=None, source: str = "", row: dict | None = None, *, gt_answer=None,
                 test_cases=None):
        # gt_answer= / test_cases=: the older spellings of the label, by kind
        label = next((value for value in (label, gt_answer, test_cases) if value is not None), None)
        for name, value in (("messages", messages), ("label", label), ("source", source), ("row", row)):
            object.__setattr__(self, name, value)

    @property
    def gt_answer(self) -> str | None:
        """The older name of a math label (a text); None for other labels."""
        return self.label if isinstance(self.label, str) else None

    @property
    def test_cases(self) -> dict | None:
        """The older name of a code label (an object); None for other labels."""
        return self.label if isinstance(self.label, dict) else None


@dataclass(frozen=True)
class RowFormat:
    """How rows map onto prompt and label. ``label_key`` None: ``label`` or the kind's older name (above)."""

    reward_type: str = DEFAULT_REWARD_TYPE
    input_key: str = "messages"
    label_key: str | None = None

    @property
    def label_field(self) -> str:
        """The field named in the message about a row without a label."""
        if self.label_key:
            return self.label_key
        return reward_type(self.reward_type).label_key

    def row_label(self, row: dict) -> tuple[str, Any]:
        """(the field the label was found in, its value; None when the row has none): ``--label-key`` when given,
        else the kind's fields in order (``RewardType.label_keys``)."""
        keys = (self.label_key,) if self.label_key else reward_type(self.reward_type).label_keys
        for key in keys:
            if row.get(key) is not None:
                return key, row[key]
        return self.label_field, None


def normalise_messages(raw: Any, key: str = "messages") -> tuple[dict, ...]:
    """A string, a role/content object or a list of them -> role/content dicts ending with the user's turn."""
    if isinstance(raw, str):
        if not raw.strip():
            raise ValueError(f'"{key}" is an empty string')
        return ({"role": "user", "content": raw},)
    messages = [raw] if isinstance(raw, dict) else raw
    if not isinstance(messages, list) or not messages:
        raise ValueError(f'"{key}" must be a string, a role/content object or a non-empty list of them')
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("content"), str):
            raise ValueError(f'"{key}"[{i}] must be an object with a string "content"')
        if message.get("role") not in ROLES:
            raise ValueError(f'"{key}"[{i}].role must be one of {", ".join(ROLES)}, got {message.get("role")!r}')
        out.append({"role": message["role"], "content": message["content"]})
    if out[-1]["role"] != "user":
        raise ValueError('the last message must have role "user" (it is the prompt the model answers)')
    return tuple(out)


def _missing(row: dict, key: str, what: str, flag: str) -> ValueError:
    present = ", ".join(name for name, value in row.items() if value is not None) or "none"
    return ValueError(f'missing "{key}" ({what}; this row has {present}: name the right one with {flag})')


def row_to_example(row: Any, fmt: RowFormat, source: str) -> Example:
    """Raises ValueError (without the location) when the row cannot be used."""
    if not isinstance(row, dict):
        raise ValueError("each row must be a JSON object")
    if row.get(fmt.input_key) is None:
        raise _missing(row, fmt.input_key, "the prompt", "--input-key")
    messages = normalise_messages(row[fmt.input_key], fmt.input_key)
    kind = reward_type(fmt.reward_type)
    label_key, label = fmt.row_label(row)
    if label is None or (isinstance(label, str) and not label.strip()):
        raise _missing(row, label_key, kind.label_shape, "--label-key")
    return Example(messages=messages, label=kind.read_label(label, label_key), source=source, row=row)


def check_rows(problems: list[tuple[str, str]], total: int) -> None:
    """(where, problem) of every bad row -> one DatasetError line: the first one, and how many more there are."""
    if problems:
        where, problem = problems[0]
        more = f" (and {len(problems) - 1} more bad rows of {total}, the next at {problems[1][0]})" \
            if len(problems) > 1 else ""
        raise DatasetError(f"{where}: {problem}{more}")
