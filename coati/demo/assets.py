"""Where the embedded demos' assets are cached, and how a build lands there: torch-free, so that the CLI can stand
in for the assets while it checks flags without importing the model code (coati/demo/math_demo.py builds them)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

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
