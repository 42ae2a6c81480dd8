"""Rows of the supervised RLHF stages: SFT demonstrations and preference pairs.

- SFT: ``{"prompt": ..., "completion": "..."}``: the model learns the completion given the prompt.
- Preferences: ``{"prompt": ..., "chosen": "...", "rejected": "..."}``: the reward model learns to score the
  chosen response above the rejected one.

The prompt is what math/code rows' prompts may be (rows.py): a string, one role/content object, or a chat
list ending with the user's turn. Responses are non-empty strings. Files are any format of loader.py
(.jsonl, a .json list, .parquet, save_to_disk); every bad row is found before any work and reported as one
line naming the first ``file:line`` (``file:row N`` outside jsonl) and how many more are bad.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from coati.dataset.loader import load_rows
from coati.dataset.rows import normalise_messages

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
