"""Reading JSON Lines datasets, with errors that name the file and line; building the prompt text.

Rows map onto examples as coati/dataset/rows.py says (by default ``{"messages": ..., "gt_answer": "3"}`` for
math, PRIME ``test_cases`` for code). Other formats (.json, .parquet, save_to_disk directories): loader.py.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, TypeVar

from coati.dataset.rows import DatasetError, Example, RowFormat, check_rows, row_to_example

__all__ = ["DatasetError", "Example", "RowFormat", "build_prompt", "load_jsonl", "plain_text_line",
           "prompt_template_problem", "read_jsonl"]
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


PROMPT_SLOT, SYSTEM_SLOT = "{prompt}", "{system}"


def build_prompt(tokenizer, messages: tuple[dict, ...], system_prompt: str | None, template: str | None = None) -> str:
    """The text the policy continues: the prompt template when one is given (a base model's: ``{prompt}`` is the
    row's text, ``{system}`` the system prompt), else the chat template when the tokenizer has one, else plain text.

    A system prompt is added unless the row brings its own. Without either template the messages are joined by
    newlines, so a tokenizer without one (the embedded demo's) sees exactly the user's text.
    """
    if template is not None:
        system = "\n".join(m["content"] for m in messages if m["role"] == "system") or system_prompt or ""
        text = "\n".join(m["content"] for m in messages if m["role"] != "system")
        return template.replace(SYSTEM_SLOT, system).replace(PROMPT_SLOT, text)
    if system_prompt and messages[0]["role"] != "system":
        messages = ({"role": "system", "content": system_prompt}, *messages)
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
    return "\n".join(message["content"] for message in messages)


def prompt_template_problem(template: str) -> str | None:
    """What is wrong with a ``--prompt-template`` (None: nothing)."""
    if PROMPT_SLOT not in template:
        return (f"--prompt-template {template!r} has no {PROMPT_SLOT}: write where the row's text goes, e.g. "
                "'Q: {prompt}\\nA:'")
    return None


def plain_text_line(model: str, system_prompt: str, chat_rows: bool) -> str | None:
    """The start line for a tokenizer without a chat template and no --prompt-template: what its prompts become
    (None when there is nothing to say: plain rows and no system prompt, as the embedded demo's)."""
    if not system_prompt and not chat_rows:
        return None
    parts = f"the system prompt {system_prompt[:32]!r}{'...' if len(system_prompt) > 32 else ''} and " \
        if system_prompt else ""
    rows = "its chat-form row's messages" if chat_rows else "its row's text"
    return (f"prompts: {model} has no chat template: each prompt is {parts}{rows} as plain text, joined by "
            "newlines; a base model continues such text as it is: give --prompt-template 'Q: {prompt}\\nA:' (and "
            f"--stop) to shape its prompts{', or -s to change the system prompt' if system_prompt else ''} "
            "(docs/data.md, base models)")
