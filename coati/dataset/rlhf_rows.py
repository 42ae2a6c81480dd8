"""Rows of the RLHF stages: SFT demonstrations, preference pairs, and prompts to evaluate a checkpoint on.

- SFT: ``{"prompt": ..., "completion": "..."}``: the model learns the completion given the prompt.
- Preferences: ``{"prompt": ..., "chosen": "...", "rejected": "..."}``: the reward model learns to score the
  chosen response above the rejected one.
- Prompts (``coati evaluate``): ``{"prompt": ...}``, or a row of the reward kind (``{"messages": ..., "label": "3"}``,
  or ``gt_answer``/``test_cases`` as older files name it: rows.py); the answer is optional: rows with one are
  scored with the verifiable reward, rows without one only by a reward model.

The prompt is what math/code rows' prompts may be (rows.py): a string, one role/content object, or a chat
list ending with the user's turn. Responses are non-empty strings. Files are any format of loader.py
(.jsonl, a .json list, .parquet, save_to_disk); every bad row is found before any work and reported as one
line naming the first ``file:line`` (``file:row N`` outside jsonl) and how many more are bad.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from coati.dataset.loader import load_rows
from coati.dataset.rows import Example, RowFormat, normalise_messages, row_to_example

PROMPT_KEY = "prompt"


@dataclass(frozen=True)
class SFTExample:
    messages: tuple[dict, ...]
    completion: str
    source: str = ""


@dataclass(frozen=True)
class PreferenceExample:
    messages: tuple[dict, ...]
    chosen: str
    rejected: str
    source: str = ""


def _fields(row: Any, names: tuple[str, ...], what: str) -> None:
    if not isinstance(row, dict):
        raise ValueError(f"each row must be a JSON object {what}")
    for name in names:
        if row.get(name) is None:
            present = ", ".join(key for key, value in row.items() if value is not None) or "none"
            raise ValueError(f'missing "{name}" (rows are {what}; this row has {present})')


def _response(row: dict, key: str) -> str:
    value = row[key]
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f'"{key}" must be a non-empty string, got {type(value).__name__} {str(value)[:40]!r}')
    return value


def sft_row(row: Any, where: str) -> SFTExample:
    _fields(row, (PROMPT_KEY, "completion"), '{"prompt": ..., "completion": "..."}')
    return SFTExample(normalise_messages(row[PROMPT_KEY], PROMPT_KEY), _response(row, "completion"), where)


def preference_row(row: Any, where: str) -> PreferenceExample:
    _fields(row, (PROMPT_KEY, "chosen", "rejected"), '{"prompt": ..., "chosen": "...", "rejected": "..."}')
    chosen, rejected = _response(row, "chosen"), _response(row, "rejected")
    if chosen == rejected:
        raise ValueError('"chosen" and "rejected" are the same text: the pair prefers nothing')
    return PreferenceExample(normalise_messages(row[PROMPT_KEY], PROMPT_KEY), chosen, rejected, where)


def load_sft(path: str) -> list[SFTExample]:
    return load_rows(path, sft_row)


def load_preferences(path: str) -> list[PreferenceExample]:
    return load_rows(path, preference_row)


def prompt_row(row: Any, where: str, fmt: RowFormat, input_key: str | None) -> Example:
    """An Example whose ``label`` is None when the row has no answer.

    ``input_key`` None: the row's ``messages`` (math/code rows), else its ``prompt`` (RLHF rows). An answer the
    row has is checked as training checks it; ``fmt.label_key`` given: every row must have one (the user said
    where the answers are, so a row without one is a mistake, not an unlabelled prompt)."""
    if not isinstance(row, dict):
        raise ValueError("each row must be a JSON object")
    key = input_key or next((name for name in ("messages", PROMPT_KEY) if row.get(name) is not None), None)
    if key is None or row.get(key) is None:
        present = ", ".join(name for name, value in row.items() if value is not None) or "none"
        wanted = f'"{input_key}"' if input_key else '"messages" or "prompt"'
        raise ValueError(f"missing {wanted} (the prompt; this row has {present}: name the right one with --input-key)")
    fmt = RowFormat(reward_type=fmt.reward_type, input_key=key, label_key=fmt.label_key)
    if fmt.label_key or fmt.row_label(row)[1] is not None:
        return row_to_example(row, fmt, where)
    return Example(messages=normalise_messages(row[key], key), source=where)


def load_prompts(path: str, fmt: RowFormat = RowFormat(), input_key: str | None = None) -> list[Example]:
    """Every row of ``path`` as a prompt with its answer when it has one (``fmt``: reward type, label key)."""
    return load_rows(path, lambda row, where: prompt_row(row, where, fmt, input_key))


def has_answer(example: Example) -> bool:
    return example.label is not None
