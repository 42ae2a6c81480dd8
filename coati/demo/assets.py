"""Where the embedded demos' assets are cached, and how a build lands there: torch-free, so that the CLI can stand
in for the assets while it checks flags without importing the model code (coati/demo/math_demo.py builds them)."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from dataclasses import dataclass


@dataclass(frozen=True)
class DemoAssets:
    model_dir: str
    train_path: str
    eval_path: str
    report: dict


def default_cache_dir() -> str:
    # An empty COATI_CACHE counts as unset (it would otherwise mean the current directory).
    return os.environ.get("COATI_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "coati")


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


def build_once(root: str, marker: str, build) -> None:
    """Runs ``build(dir)`` into a staging directory and renames it to ``root``, unless ``root/marker`` exists.
    A killed build never looks finished (the marker comes with the rename), and runs sharing one cache build it
    once: the others wait on the lock, then find it built."""
    if os.path.isfile(os.path.join(root, marker)):
        return
    parent = os.path.dirname(root)
    os.makedirs(parent, exist_ok=True)
    with open(os.path.join(parent, f".{os.path.basename(root)}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.isfile(os.path.join(root, marker)):
            return
        staging = tempfile.mkdtemp(prefix=f".{os.path.basename(root)}.building-", dir=parent)
        try:
            build(staging)
            shutil.rmtree(root, ignore_errors=True)  # an unfinished build has no marker
            os.replace(staging, root)  # atomic
        finally:
            shutil.rmtree(staging, ignore_errors=True)
