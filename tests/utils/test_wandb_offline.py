"""The real wandb (a base dependency): offline by default, a run directory that ``wandb sync`` accepts, nothing
printed of its own; WANDB_MODE=disabled turns it off."""

import glob
import os
import subprocess
import sys

from coati.utils.metrics import MetricsLogger


def test_offline_run_directory_that_wandb_sync_accepts(tmp_path, monkeypatch, capfd):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_DISABLE_WEAVE", raising=False)
    import openai  # noqa: F401 - loaded, as vLLM loads it: wandb would advertise Weave tracing
    messages = []
    logger = MetricsLogger(str(tmp_path), "p", {"lr": 1e-6}, log=messages.append)
    logger.log(1, {"reward": 0.5, "loss": 0.1})
    logger.log(0, {"task": "add", "mode": "greedy", "accuracy": 0.25}, kind="eval")
    logger.close()
    runs = glob.glob(str(tmp_path / "wandb" / "offline-run-*"))
    assert len(runs) == 1 and glob.glob(os.path.join(runs[0], "run-*.wandb"))
    assert messages == [f"wandb logging offline (upload: wandb sync {runs[0]})"]
    out, err = capfd.readouterr()
    assert "wandb" not in out + err  # silent: the one line above is all the user sees
    # --dry-run reads the run's files and says what it would upload, without a network.
    proc = subprocess.run([sys.executable, "-m", "wandb", "sync", "--dry-run", runs[0]], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and "Would sync 1 run(s)" in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def test_disabled_mode_logs_to_the_jsonl_only(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    messages = []
    logger = MetricsLogger(str(tmp_path), "p", log=messages.append)
    logger.log(1, {"loss": 0.1})
    logger.close()
    assert messages == ["wandb is off (WANDB_MODE=disabled): metrics go to the jsonl file only"]
    assert not os.path.exists(tmp_path / "wandb") and os.path.getsize(tmp_path / "metrics.jsonl") > 0


def test_disabled_mode_never_imports_wandb(tmp_path):
    """Its import alone costs seconds of every run's start."""
    code = ("import sys; from coati.utils.metrics import MetricsLogger; "
            f"MetricsLogger({str(tmp_path)!r}, 'p', log=lambda m: None).close(); print('wandb' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, "WANDB_MODE": "disabled"},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "False", proc.stdout + proc.stderr
