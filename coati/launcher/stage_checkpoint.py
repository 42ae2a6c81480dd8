"""Checkpoints of the supervised stages (``coati sft`` / ``coati rm``), the driver's side, and ``--resume``.

Every ``-si`` steps the stage writes ``<save-dir>/<project>/step_N`` atomically (coati/utils/checkpoint.py): the
trainer state (parameters and optimizer state, every rank its shards, in any layout the plugin reads back;
coati/trainer/checkpointing.py) and the step with the held-out metrics from before training. A step's rows
depend only on the step and the seed (``SupervisedFeed.step_items`` in coati/trainer/supervised.py), so a
resumed run trains the same batches an uninterrupted one would.
"""

from __future__ import annotations

import json
import os

from coati.config.errors import ConfigError, require
from coati.utils.checkpoint import atomic_directory, changed_settings, mark_complete, resolve_resume

STATE = "stage_state.json"
# what must not change between the run that saved and the one that resumes: the batches would differ
KEPT = ("stage", "batch_size", "seed", "epochs", "eval_fraction")


def _kept(config) -> dict:
    return {name: getattr(config, name) for name in KEPT}


def save(group, config, step: int, before: dict) -> str:
    """Collective: ``step_<step>`` of the run, complete or absent."""
    path = os.path.join(config.run_dir, f"step_{step}")
    with atomic_directory(path) as staging:
        group.call("save_checkpoint", staging)
        with open(os.path.join(staging, STATE), "w", encoding="utf-8") as handle:
            json.dump({"step": step, "before": before, **_kept(config)}, handle)
        mark_complete(staging, {"step": step})
    return path


def resume_point(config) -> str | None:
    """The checkpoint ``--resume`` names (a path or ``latest``), checked against the options: one ConfigError
    line, before any model is built."""
    if config.resume is None:
        return None
    try:
        path = resolve_resume(config.resume, config.run_dir)
    except FileNotFoundError as err:
        raise ConfigError(str(err)) from None
    state = read_state(path)
    changed = changed_settings(state, _kept(config))
    require(not changed, f"--resume {path}: the run must keep the options that choose its batches; changed: "
                         f"{', '.join(changed)}")
    return path


def read_state(path: str) -> dict:
    state_path = os.path.join(path, STATE)
    require(os.path.isfile(state_path), f"--resume {path}: not a checkpoint of coati sft/rm (no {STATE})")
    with open(state_path, encoding="utf-8") as handle:
        return json.load(handle)


def restore(group, path: str) -> dict:
    """Collective, after setup: the trainer state of ``path``; its step and metrics from before training."""
    try:
        group.call("load_checkpoint", path)
    except ValueError as err:  # a layout that cannot read the checkpoint's
        raise ConfigError(f"--resume {path}: {err}") from None
    return read_state(path)


def earlier_losses(metrics_path: str) -> list[float]:
    """The training losses already logged (a resumed run's report covers the whole run)."""
    if not os.path.isfile(metrics_path):
        return []
    with open(metrics_path, encoding="utf-8") as handle:
        rows = [json.loads(line) for line in handle if line.strip()]
    return [row["loss"] for row in rows if row.get("kind") == "train"]
