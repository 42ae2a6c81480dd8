"""Where the embedded demos' assets are cached, and how a build lands there: torch-free, so that the CLI can stand
in for the assets while it checks flags without importing the model code (coati/demo/math_demo.py builds them);
the real-model demos' task rows, written once (``rows_in_cache``), for smollm2.py and gemma3.py."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Callable

from coati.utils.cache import build_once, default_cache_dir


@dataclass(frozen=True)
class DemoAssets:
    model_dir: str
    train_path: str
    eval_path: str
    report: dict


def demo_root(cache_dir: str | None, recipe) -> str:
    """``<cache>/<recipe.cache_prefix>-<fingerprint>``: where a demo's assets built from ``recipe`` are cached."""
    return os.path.join(cache_dir or default_cache_dir(), f"{recipe.cache_prefix}-{recipe.fingerprint()}")


def ensure_built(root: str, build) -> DemoAssets:
    """The assets in ``root`` (model/, train.jsonl, eval.jsonl, report.json), running ``build(dir)`` first
    when they are missing."""
    build_once(root, "report.json", build)
    with open(os.path.join(root, "report.json")) as handle:
        report = json.load(handle)
    return DemoAssets(os.path.join(root, "model"), os.path.join(root, "train.jsonl"),
                      os.path.join(root, "eval.jsonl"), report)


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
