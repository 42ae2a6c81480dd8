"""Metrics sinks: a jsonl file per run (always) and wandb (installed by scripts/setup.sh).

wandb runs offline (``<run dir>/wandb/offline-run-*``, which ``wandb sync DIR`` uploads later) unless the
user asks for online with ``WANDB_MODE=online``; ``WANDB_MODE=disabled`` turns it off. Offline never waits on
a network. wandb prints nothing of its own and leaves stdout alone (the progress bar and eval lines stay
readable): one line says where the run went. It never stops the run: if it is not installed, cannot be
imported, fails to start, or fails while logging, one message says so and the metrics keep going to the
jsonl file.

Eval rows arrive after later training rows (the evaluator runs beside training), and wandb drops a value
logged at a step older than its latest, so eval metrics use their own x-axis ``eval/step``
(``define_metric``) under keys ``eval/<task>/<mode>/<metric>``.
"""

from __future__ import annotations

import json
import os
import time


class MetricsLogger:
    def __init__(self, run_dir: str, project: str, config: dict | None = None, log=print, resume: bool = False):
        os.makedirs(run_dir, exist_ok=True)
        self.log_message = log
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
        self._start_wandb(run_dir, project, config)

    def _start_wandb(self, run_dir: str, project: str, config: dict | None) -> None:
        mode = os.environ.get("WANDB_MODE", "offline")
        if mode == "disabled":  # checked before the import, which alone costs seconds
            self.log_message("wandb is off (WANDB_MODE=disabled): metrics go to the jsonl file only")
            return
        try:
            import wandb
        except ImportError:
            self.log_message("wandb is not installed: metrics go to the jsonl file only (pip install wandb to add it)")
            return
        except Exception as err:  # noqa: BLE001 - a broken install (e.g. a protobuf clash) must not stop the run
            self.log_message(f"wandb could not be imported ({type(err).__name__}: {err}); "
                             "metrics go to the jsonl file only")
            return
        # wandb.init advertises its Weave tracing once per process when an LLM client library (openai, which
        # vLLM imports) is loaded, whatever "silent" says; a user who wants Weave sets this to false.
        os.environ.setdefault("WANDB_DISABLE_WEAVE", "true")
        try:
            # silent: no banner or summary of its own; console off: it does not wrap this process's stdout.
            run = wandb.init(project=project, dir=run_dir, mode=mode, config=config or {},
                             settings={"silent": True, "console": "off", "init_timeout": 60})
            run.define_metric("eval/step")
            run.define_metric("eval/*", step_metric="eval/step")
        except Exception as err:  # noqa: BLE001 - any wandb failure degrades to jsonl only
            self.log_message(f"wandb could not start ({type(err).__name__}: {err}); metrics go to the jsonl file only")
            return
        self._wandb = run
        if mode == "offline":
            where = getattr(getattr(run, "settings", None), "sync_dir", None) or os.path.join(run_dir, "wandb")
            self.log_message(f"wandb logging offline (upload: wandb sync {where})")
        else:
            self.log_message(f"wandb logging {mode} to {getattr(run, 'url', None) or run_dir}")

    def log(self, step: int, metrics: dict, kind: str = "train") -> None:
        row = {"step": step, "kind": kind, "time_s": round(time.time() - self._start, 3), **metrics}
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        if self._wandb is not None:
            self._log_wandb(step, metrics, kind)

    def _log_wandb(self, step: int, metrics: dict, kind: str) -> None:
        numbers = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
        try:
            if kind == "eval":
                prefix = f"eval/{metrics.get('task', 'eval')}/{metrics.get('mode', 'eval')}"
                self._wandb.log({"eval/step": step, **{f"{prefix}/{k}": v for k, v in numbers.items()}})
            else:
                self._wandb.log({f"{kind}/{k}": v for k, v in numbers.items()}, step=step)
        except Exception as err:  # noqa: BLE001
            self.log_message(f"wandb logging failed ({type(err).__name__}: {err}); "
                             "from now on metrics go to the jsonl file only")
            self._wandb = None

    def close(self) -> None:
        self._file.close()
        if self._wandb is not None:
            try:
                self._wandb.finish()
            except Exception:  # noqa: BLE001
                pass
