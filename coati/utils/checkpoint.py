"""Atomic checkpoint directories: a crash mid-save never leaves a checkpoint that looks complete.

A checkpoint is written into a hidden staging directory beside its final name and renamed into place
only after every file is written and flushed; ``rename`` within one filesystem is atomic, so readers see
either the previous checkpoint set or the new one, never half a directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile

_STEP_DIR = re.compile(r"^step_(\d+)$")
COMPLETE_MARKER = "checkpoint_complete.json"  # written last inside the staging directory


def _fsync_tree(path: str) -> None:
    for root, _, files in os.walk(path):
        for name in files:
            with open(os.path.join(root, name), "rb") as handle:
                os.fsync(handle.fileno())


@contextlib.contextmanager
def atomic_directory(final_path: str):
    """Yields a staging directory; on success it replaces ``final_path`` atomically, on error it is removed."""
    parent = os.path.dirname(os.path.abspath(final_path))
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(final_path)}.staging-", dir=parent)
    try:
        yield staging
        _fsync_tree(staging)
        if os.path.exists(final_path):  # re-saving the same step: move the old one aside first
            retired = tempfile.mkdtemp(prefix=f".{os.path.basename(final_path)}.retired-", dir=parent)
            os.replace(final_path, os.path.join(retired, "old"))
            os.replace(staging, final_path)
            shutil.rmtree(retired, ignore_errors=True)
        else:
            os.replace(staging, final_path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def list_checkpoints(run_dir: str) -> list[tuple[int, str]]:
    """Complete ``step_N`` checkpoints of a run, oldest first."""
    if not os.path.isdir(run_dir):
        return []
    found = []
    for name in os.listdir(run_dir):
        match = _STEP_DIR.match(name)
        path = os.path.join(run_dir, name)
        if match and os.path.isfile(os.path.join(path, COMPLETE_MARKER)):
            found.append((int(match.group(1)), path))
    return sorted(found)


def prune_checkpoints(run_dir: str, keep: int, newest: str) -> list[str]:
    """Deletes the complete ``step_N`` checkpoints of ``run_dir`` beyond the newest ``keep`` by step, never
    ``newest`` (the one just written: a run resumed from an older step may have higher ones beside it). Returns
    the deleted paths. Incomplete directories are left alone: they may still be written."""
    newest = os.path.abspath(newest)
    others = [path for _, path in list_checkpoints(run_dir) if os.path.abspath(path) != newest]
    doomed = others[:max(0, len(others) - (keep - 1))]
    for path in doomed:
        # Renamed first, so that an interrupted delete never leaves a step_N with a marker but missing files.
        retired = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.retired-", dir=os.path.dirname(path))
        os.replace(path, os.path.join(retired, "old"))
        shutil.rmtree(retired, ignore_errors=True)
    return doomed


def resolve_resume(value: str, run_dir: str) -> str:
    """``--resume latest`` -> the newest complete checkpoint of ``run_dir``; a path must be complete."""
    if value == "latest":
        checkpoints = list_checkpoints(run_dir)
        if not checkpoints:
            raise FileNotFoundError(f"--resume latest: no complete checkpoint under {run_dir}")
        return checkpoints[-1][1]
    if not os.path.isfile(os.path.join(value, COMPLETE_MARKER)):
        raise FileNotFoundError(f"--resume {value}: not a complete checkpoint directory (no {COMPLETE_MARKER})")
    return value


def mark_complete(staging: str, marker: dict) -> None:
    """The last file of a checkpoint being staged, after every other is written: its completion marker
    (``list_checkpoints`` and ``--resume`` take only directories that have one)."""
    with open(os.path.join(staging, COMPLETE_MARKER), "w", encoding="utf-8") as handle:
        json.dump(marker, handle)


def changed_settings(saved: dict, now: dict) -> list[str]:
    """``name saved -> now`` for each setting of ``now`` that a resumed run must keep and does not."""
    return [f"{name} {saved.get(name)!r} -> {value!r}" for name, value in now.items() if saved.get(name) != value]
