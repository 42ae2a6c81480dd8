"""The real-model demos ``--demo NAME`` offers, one row each: a demo is a set of flag defaults on top of a user's-
model run (a shipped model, a task's rows written once into the cache, a reward), so every flag still applies and
the run is what a user's own would be. Torch-free: the CLI reads these rows before it builds its parser."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Callable

from coati.utils.cache import build_once, default_cache_dir


@dataclass(frozen=True)
class RealModelDemo:
    name: str
    summary: str  # the --demo help text's line
    defaults: Callable[[], dict]  # option dest -> default; FileNotFoundError (the install line) when not shipped


def rows_in_cache(name: str, splits: Callable[[], tuple[list[dict], list[dict]]], cache_dir: str | None = None) -> str:
    """``<cache>/<name>``, holding train.jsonl and eval.jsonl of ``splits()`` (train rows, held-out rows), written
    once."""
    root = os.path.join(cache_dir or default_cache_dir(), name)

    def build(out_dir: str) -> None:
        for file_name, rows in zip(("train.jsonl", "eval.jsonl"), splits()):
            with open(os.path.join(out_dir, file_name), "w", encoding="utf-8") as handle:
                handle.writelines(json.dumps(row) + "\n" for row in rows)

    build_once(root, "eval.jsonl", build)
    return root


def real_model_demos() -> dict[str, RealModelDemo]:
    from coati.demo import gemma3, smollm2

    return {module.NAME: RealModelDemo(module.NAME, module.SUMMARY, module.demo_defaults)
            for module in (smollm2, gemma3)}
