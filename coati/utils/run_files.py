"""Output files of a run that are not metrics: eval records + summary, rollout logs, and how a new run in a
used directory keeps the previous run's files instead of mixing with them."""

from __future__ import annotations

import glob
import json
import os
import time

ROLLOUT_FILE_BYTES = 64 << 20  # a rollout log file is closed after the first step that takes it past this


def set_aside(directory: str, patterns: tuple[str, ...], log=print) -> str | None:
    """Move files matching ``patterns`` in ``directory`` into ``directory/previous_<time>/`` (a new run in a
    used directory would otherwise overwrite some of them and leave others, e.g. later steps, mixed in)."""
    found = sorted({path for pattern in patterns for path in glob.glob(os.path.join(directory, pattern))})
    if not found:
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(max(os.path.getmtime(p) for p in found)))
    kept = os.path.join(directory, f"previous_{stamp}")
    os.makedirs(kept, exist_ok=True)
    for path in found:
        os.replace(path, os.path.join(kept, os.path.basename(path)))
    log(f"{directory} held {len(found)} files of a previous run: moved to {kept}")
    return kept


def write_json_atomic(path: str, value) -> None:
    """Readers (and a crash mid-write) never see a half-written file."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(value, handle, indent=1)
    os.replace(tmp, path)


class EvalWriter:
    """``<dir>/<task>_<mode>_step<N>.jsonl`` (every prompt, response, extracted answer, reward) and
    ``<dir>/summary.json``: one row per (step, task, mode), rewritten after every result."""

    PATTERNS = ("*_step*.jsonl", "summary.json")

    def __init__(self, directory: str, log=print, resume: bool = False):
        os.makedirs(directory, exist_ok=True)
        self.directory = directory
        self.summary_path = os.path.join(directory, "summary.json")
        self.rows: list[dict] = []
        if resume and os.path.exists(self.summary_path):
            with open(self.summary_path, encoding="utf-8") as handle:
                self.rows = json.load(handle)["results"]
        elif not resume:
            set_aside(directory, self.PATTERNS, log)

    def write(self, step: int, task: str, mode: str, records: list[dict], summary: dict) -> str:
        name = f"{task}_{mode}_step{step}.jsonl"
        with open(os.path.join(self.directory, name), "w", encoding="utf-8") as handle:
            for record in records:
                handle.write(json.dumps(record) + "\n")
        self.rows = [r for r in self.rows if (r["step"], r["task"], r["mode"]) != (step, task, mode)]
        self.rows.append({"step": step, "task": task, "mode": mode, **summary, "file": name})
        self.rows.sort(key=lambda r: (r["step"], r["task"], r["mode"]))
        write_json_atomic(self.summary_path, {"results": self.rows})
        return name


class RolloutWriter:
    """Rollout logs: ``<dir>/rollouts_step<first step>.jsonl``, one json line per sample.

    Rotation: a file holds whole steps; once it has reached ``max_bytes`` the next logged step starts a new
    file named after that step, so a step's samples are never split and a file name says where it starts.
    """

    PATTERNS = ("rollouts_step*.jsonl",)

    def __init__(self, directory: str, max_bytes: int | None = None, log=print, resume: bool = False):
        os.makedirs(directory, exist_ok=True)
        if not resume:
            set_aside(directory, self.PATTERNS, log)
        self.directory, self.max_bytes = directory, max_bytes or ROLLOUT_FILE_BYTES
        self._file = None
        self.paths: list[str] = []

    def write(self, step: int, records: list[dict]) -> None:
        if self._file is None or self._file.tell() >= self.max_bytes:
            self.close()
            path = os.path.join(self.directory, f"rollouts_step{step:06d}.jsonl")
            self._file = open(path, "a", encoding="utf-8")
            self.paths.append(path)
        for record in records:
            self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
