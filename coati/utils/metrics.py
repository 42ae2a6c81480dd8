"""Metrics sinks: a jsonl file per run (always) and wandb when it is installed (offline unless asked)."""

from __future__ import annotations

import json
import os
import time


class MetricsLogger:
    def __init__(self, run_dir: str, project: str, config: dict | None = None, log=print, resume: bool = False):
        os.makedirs(run_dir, exist_ok=True)
        self.path = os.path.join(run_dir, "metrics.jsonl")
        if os.path.exists(self.path) and not resume:
            # A new run in a used directory: keep the old metrics under a dated name, never overwrite them.
            stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(os.path.getmtime(self.path)))
            kept = os.path.join(run_dir, f"metrics.{stamp}.jsonl")
            os.replace(self.path, kept)
            log(f"{self.path} existed: the previous run's metrics were moved to {kept}")
        self._file = open(self.path, "a", encoding="utf-8")
        self._wandb = None
        self._start = time.time()
        try:
            import wandb
        except ImportError:
            log("wandb is not installed: metrics go to the jsonl file only (pip install wandb to add it)")
            return
        # Offline unless the user opted in with WANDB_MODE=online; a failing wandb never stops the run.
        mode = os.environ.get("WANDB_MODE", "offline")
        try:
            self._wandb = wandb.init(project=project, dir=run_dir, mode=mode, config=config or {})
        except Exception as err:  # noqa: BLE001 - any wandb failure degrades to jsonl only
            log(f"wandb could not start ({err}); metrics go to the jsonl file only")

    def log(self, step: int, metrics: dict, kind: str = "train") -> None:
        row = {"step": step, "kind": kind, "time_s": round(time.time() - self._start, 3), **metrics}
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        if self._wandb is not None:
            try:
                self._wandb.log({f"{kind}/{k}": v for k, v in metrics.items() if isinstance(v, (int, float))}, step=step)
            except Exception:  # noqa: BLE001
                pass

    def close(self) -> None:
        self._file.close()
        if self._wandb is not None:
            try:
                self._wandb.finish()
            except Exception:  # noqa: BLE001
                pass
