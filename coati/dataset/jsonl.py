"""Reading JSON Lines datasets, with errors that name the file and line; building the prompt text.

Rows map onto examples as coati/dataset/rows.py says (by default ``{"messages": ..., "gt_answer": "3"}`` for
math, PRIME ``test_cases`` for code). Other formats (.json, .parquet, save_to_disk directories): loader.py.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, TypeVar

from coati.dataset.rows import DatasetError, Example, RowFormat, check_rows, row_to_example

__all__ = ["DatasetError", "Example", "RowFormat", "build_prompt", "load_jsonl", "read_jsonl"]
T = TypeVar("T")


def load_jsonl(path: str, fmt: RowFormat | str = RowFormat()) -> list[Example]:
    """Read and check every row; bad rows raise one DatasetError naming the first ``path:line``.

    ``fmt`` is a RowFormat, or a reward type name for the default field names.
    """
    if isinstance(fmt, str):
        fmt = RowFormat(reward_type=fmt)
    return read_jsonl(path, lambda row, where: row_to_example(row, fmt, where))


def read_jsonl(path: str, convert: Callable[[Any, str], T]) -> list[T]:
    """``convert(row, "path:line")`` of every row (it raises ValueError for a bad row); all problems are
    collected and reported as one DatasetError naming the first bad ``path:line``."""
    if not os.path.isfile(path):
        raise DatasetError(f"dataset file not found: {path} (pass an existing .jsonl file)")
    items, problems, rows = [], [], 0
    with open(path, encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            rows += 1
            where = f"{path}:{line_no}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                problems.append((where, f"not valid JSON ({err.msg} at column {err.colno})"))
                continue
            try:
                items.append(convert(row, where))
            except ValueError as err:
                problems.append((where, str(err)))
    check_rows(problems, rows)
    if not items:
        raise DatasetError(f"{path}: no examples (the file is empty)")
    return items


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
