"""Loading prompt datasets from jsonl, with errors that name the file and line.

Math rows: ``{"messages": {"role": "user", "content": ...}, "gt_answer": "3"}``; ``messages`` may also be a
list of role/content dicts. Code rows (PRIME format) carry ``test_cases`` with equal-length string lists
``inputs`` and ``outputs`` instead of ``gt_answer``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable

_ROLES = ("system", "user", "assistant")


class DatasetError(ValueError):
    """A dataset file is missing or malformed; the message names the file, the line and the fix."""


@dataclass(frozen=True)
class Example:
    messages: tuple[dict, ...]  # role/content dicts, in order
    gt_answer: str | None = None  # math tasks
    test_cases: dict | None = field(default=None, compare=False)  # code tasks
    source: str = ""  # "file:line", for messages about this example


def _normalise_messages(raw: Any) -> tuple[dict, ...]:
    messages = [raw] if isinstance(raw, dict) else raw
    if not isinstance(messages, list) or not messages:
        raise ValueError('"messages" must be a role/content object or a non-empty list of them')
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("content"), str):
            raise ValueError(f'"messages"[{i}] must be an object with a string "content"')
        if message.get("role") not in _ROLES:
            raise ValueError(f'"messages"[{i}].role must be one of {", ".join(_ROLES)}, got {message.get("role")!r}')
        out.append({"role": message["role"], "content": message["content"]})
    if out[-1]["role"] != "user":
        raise ValueError('the last message must have role "user" (it is the prompt the model answers)')
    return tuple(out)


def _math_fields(row: dict) -> dict:
    answer = row.get("gt_answer")
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
        answer = str(answer)
    if not isinstance(answer, str) or not answer.strip():
        raise ValueError('missing "gt_answer" (a non-empty string such as "42"), needed by math rewards')
    return {"gt_answer": answer}


def _code_fields(row: dict) -> dict:
    from rewards.code import validate_test_cases  # imported lazily: math users need no sandbox

    problem = validate_test_cases(row.get("test_cases"))
    if problem:
        raise ValueError(problem)
    return {"test_cases": row["test_cases"]}


def load_jsonl(path: str, reward_type: str) -> list[Example]:
    """Read and validate every row; the first bad row raises DatasetError naming ``path:line``."""
    if not os.path.isfile(path):
        raise DatasetError(f"dataset file not found: {path} (pass an existing .jsonl file)")
    fields: Callable[[dict], dict] = _code_fields if reward_type == "code" else _math_fields
    examples = []
    with open(path, encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}:{line_no}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise DatasetError(f"{where}: not valid JSON ({err.msg} at column {err.colno})") from None
            try:
                if not isinstance(row, dict):
                    raise ValueError("each line must be a JSON object")
                if "messages" not in row:
                    raise ValueError('missing "messages"')
                examples.append(Example(messages=_normalise_messages(row["messages"]), source=where, **fields(row)))
            except ValueError as err:
                raise DatasetError(f"{where}: {err}") from None
    if not examples:
        raise DatasetError(f"{path}: no examples (the file is empty)")
    return examples


def build_prompt(tokenizer, messages: tuple[dict, ...], system_prompt: str | None) -> str:
    """The text the policy continues: the chat template when the tokenizer has one, else plain text.

    A system prompt is added unless the row brings its own. Without a chat template the messages are joined
    by newlines, so a tokenizer without one (the embedded demo's) sees exactly the user's text.
    """
    if system_prompt and messages[0]["role"] != "system":
        messages = ({"role": "system", "content": system_prompt}, *messages)
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
    return "\n".join(message["content"] for message in messages)
