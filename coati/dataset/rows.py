"""One dataset row -> one ``Example``: which field is the prompt, which the answer, and what they may look like.

``RowFormat`` names the fields (OpenRLHF's ``--input-key`` / ``--label-key``). The prompt field may hold a
plain string (the user's message), one role/content object, or a chat list of them ending with the user's
turn. The label field holds, for math rewards, the gold answer or a worked solution that ends in one:
GSM8K's ``"... #### 72"`` gives ``72`` and MATH's ``"... \\boxed{\\frac{1}{2}}."`` gives ``\\frac{1}{2}``
(see ``final_answer``); for ``-rt code``, PRIME test cases (an object, or that object as a JSON string).

Every problem raises ``ValueError`` with a message that the loaders prefix with ``file:line`` or ``file:row``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from rewards import DEFAULT_REWARD_TYPE, reward_type

ROLES = ("system", "user", "assistant")
# A comma between digit groups, as in "1,000,000"; GSM8K's final answers are plain numbers.
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


class DatasetError(ValueError):
    """A dataset file is missing or malformed; the message names the file, the line or row, and the fix."""


@dataclass(frozen=True)
class Example:
    messages: tuple[dict, ...]  # role/content dicts, in order
    gt_answer: str | None = None  # math tasks
    test_cases: dict | None = field(default=None, compare=False)  # code tasks
    source: str = ""  # "file:line" or "file:row N", for messages about this example
    row: dict | None = field(default=None, compare=False, repr=False)  # the whole row, for --reward-fn


@dataclass(frozen=True)
class RowFormat:
    """How rows map onto prompt and answer. ``label_key`` None: ``gt_answer`` (math) or ``test_cases`` (code)."""

    reward_type: str = DEFAULT_REWARD_TYPE
    input_key: str = "messages"
    label_key: str | None = None

    @property
    def label_field(self) -> str:
        if self.label_key:
            return self.label_key
        return reward_type(self.reward_type).label_key


def final_answer(label: Any) -> str:
    """The gold answer a math label stands for.

    ``"... #### 1,080"`` (GSM8K) -> ``"1080"``: the text after the last ``####``, thousands separators dropped.
    Else a label holding ``\\boxed{...}`` (a MATH solution) -> the last box's content, or the contents of the
    listed boxes it ends with, joined by ", " (``\\boxed{1}$ and $\\boxed{-2}`` -> ``1, -2``). Else the label itself,
    stripped; numbers become their string.
    """
    if isinstance(label, bool) or not isinstance(label, (str, int, float)):
        raise ValueError(f"must be a string or a number, got {type(label).__name__}")
    if not isinstance(label, str):
        return str(label)
    from rewards.math import final_boxes

    if "####" in label:
        answer = _THOUSANDS.sub("", label.rsplit("####", 1)[1].strip())
    else:
        boxes = final_boxes(label)  # several listed boxes ("\boxed{1} and \boxed{-2}") are one list answer
        answer = (", ".join(boxes) if boxes else label).strip()
    if not answer:
        raise ValueError("holds no answer (empty, or nothing after '####' or inside \\boxed{})")
    return answer


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


def _test_cases(value: Any) -> dict:
    from rewards.code import validate_test_cases  # imported lazily: math users need no sandbox

    if isinstance(value, str):  # some PRIME exports store the object as a JSON string
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise ValueError("test_cases is a string but not a JSON object") from None
    problem = validate_test_cases(value)
    if problem:
        raise ValueError(problem)
    return value


def row_to_example(row: Any, fmt: RowFormat, source: str) -> Example:
    """Raises ValueError (without the location) when the row cannot be used."""
    if not isinstance(row, dict):
        raise ValueError("each row must be a JSON object")
    if row.get(fmt.input_key) is None:
        raise _missing(row, fmt.input_key, "the prompt", "--input-key")
    messages = normalise_messages(row[fmt.input_key], fmt.input_key)
    label_key = fmt.label_field
    label = row.get(label_key)
    if reward_type(fmt.reward_type).runs_code:
        if label is None:
            raise _missing(row, label_key, "PRIME test cases", "--label-key")
        return Example(messages=messages, test_cases=_test_cases(label), source=source, row=row)
    if label is None or (isinstance(label, str) and not label.strip()):
        raise _missing(row, label_key, 'the answer, a non-empty string such as "42", needed by math rewards',
                       "--label-key")
    try:
        return Example(messages=messages, gt_answer=final_answer(label), source=source, row=row)
    except ValueError as err:
        raise ValueError(f'"{label_key}" {err}') from None


def check_rows(problems: list[tuple[str, str]], total: int) -> None:
    """(where, problem) of every bad row -> one DatasetError line: the first one, and how many more there are."""
    if problems:
        where, problem = problems[0]
        more = f" (and {len(problems) - 1} more bad rows of {total}, the next at {problems[1][0]})" \
            if len(problems) > 1 else ""
        raise DatasetError(f"{where}: {problem}{more}")
