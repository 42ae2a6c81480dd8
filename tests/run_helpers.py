"""What the end-to-end tests share: small data files cut from the demo's, one CLI-configured run over Ray, and
the CLI in a child process timed without its start-up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import contextmanager

import pytest
import ray

import coati.launcher.checkpoints as checkpointing
from coati.config.cli import build_parser, config_from_args
from coati.launcher.preflight import check_inputs
from coati.launcher.rl import run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def head(src, dst, n):
    """The first ``n`` lines of ``src`` written to ``dst``; its path."""
    with open(src) as f_in, open(dst, "w") as f_out:
        for _ in range(n):
            f_out.write(f_in.readline())
    return str(dst)


class Gate:
    """``--reward-fn`` flags of a reward that adds 0 to every sample and, while ``close(after)`` holds, waits before
    scoring in the run's actors once its metrics.jsonl has ``after`` training rows; ``open()`` lets it go on. The
    driver writes step k's row before it starts step k + 1, and in sync mode a round is scored only after the
    publish inside the step before it: held after row k, a run trains no step past k + 1 and the rest of its round.
    For the tests that signal or kill a tiny run after a step: its steps take a fraction of a second, and without
    a hold the run could end before the signal lands."""

    def __init__(self, tmp_path, run_dir):
        self.hold = tmp_path / "hold"
        path = tmp_path / "gate.py"
        path.write_text(
            "import json, os, sys, time\n"
            f"HOLD, METRICS = {str(self.hold)!r}, {str(run_dir / 'metrics.jsonl')!r}\n"
            "DRIVER = sys.argv[0].endswith('rl_example.py')  # its check call at start is never held\n"
            "def rows():\n"
            "    if not os.path.exists(METRICS):\n"
            "        return 0\n"
            "    return sum('\"kind\": \"train\"' in line for line in open(METRICS))\n"
            "def gate(response, label, row):\n"
            "    while not DRIVER and os.path.exists(HOLD) and rows() >= int(open(HOLD).read() or 0):\n"
            "        time.sleep(0.05)\n"
            "    return 0.0\n")
        self.flags = ["--reward-fn", f"{path}:gate"]

    def close(self, after: int) -> None:
        self.hold.write_text(str(after))

    def open(self) -> None:
        self.hold.unlink(missing_ok=True)


# Slots, not cores: the largest in-process run of the tests (two trainer ranks, producers, an evaluator) fits.
# Thread budgets count the machine's cores, not these (cluster/schedule.node_cores).
MODULE_RAY_CPUS = 8


def run_in_module_ray(config, log=lambda message: None):
    """``launcher.rl.run`` on the test module's local Ray cluster: the module's first run starts it and
    conftest.py shuts it down after the module, so later runs skip Ray's own start-up (about 6 s on 2 cores).
    A run ends by killing its actors and removing its placement groups; a failed run's groups are removed too,
    and the actors placed in them with them, so every run finds the CPU slots free (a failed run's buffer and
    weight store, which hold no slot, stay until the module ends)."""
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=MODULE_RAY_CPUS, include_dashboard=False, logging_level="ERROR",
                 log_to_driver=False)
    return run(config, log=log)


def run_cli(argv: list[str], demo_assets):
    """Parse and check ``argv`` like rl_example.py and run it (``run_in_module_ray``); (RunResult, every
    metrics.jsonl row)."""
    config = config_from_args(build_parser().parse_args(argv), demo_assets)
    check_inputs(config)
    result = run_in_module_ray(config)
    return result, [json.loads(line) for line in open(result.metrics_path)]


class Killed(BaseException):
    """The process 'dies' (not an Exception: nothing on the way may catch it)."""


@contextmanager
def killed_while_saving(monkeypatch, step: int):
    """The run dies while saving checkpoint ``step``: after the trainer ranks wrote their state, before the
    run state and the completion marker. Expects the run inside to die so."""
    write = checkpointing.write_run_state

    def dies(staging, state):
        if state["step"] == step:
            raise Killed(f"killed while saving step {step}")
        write(staging, state)

    monkeypatch.setattr(checkpointing, "write_run_state", dies)
    with pytest.raises(Killed):
        yield
    monkeypatch.undo()


def timed_cli(argv: list[str], env: dict, tmp_path) -> tuple[list[str], float]:
    """rl_example.py in a child process (tests/timed_cli.py): (its non-empty output lines, the seconds spent in
    launch.run until it raised); it must have exited with status 1."""
    timing = tmp_path / "seconds"
    proc = subprocess.run([sys.executable, "tests/timed_cli.py", *argv], cwd=ROOT, capture_output=True, text=True,
                          env=dict(env, TIMED_CLI_OUT=str(timing)), timeout=120)
    output = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert proc.returncode == 1, output
    seconds = float(timing.read_text())
    print(f"{output[0][:60]}...: {seconds:.1f} s")
    return output, seconds


def fill_hub_cache(hf_home, repo: str, model_dir: str) -> str:
    """``model_dir``'s files as huggingface_hub caches a download of ``repo`` under ``hf_home``
    (hub/models--ORG--NAME/: blobs named by content hash, snapshots/<commit>/ links to them, refs/main naming the
    commit); the snapshot directory."""
    import hashlib

    cache = os.path.join(str(hf_home), "hub", "models--" + repo.replace("/", "--"))
    commit = hashlib.sha1(repo.encode()).hexdigest()
    snapshot = os.path.join(cache, "snapshots", commit)
    os.makedirs(os.path.join(cache, "blobs"), exist_ok=True)
    os.makedirs(os.path.join(cache, "refs"), exist_ok=True)
    for root, _, files in os.walk(model_dir):
        for name in files:
            source = os.path.join(root, name)
            data = open(source, "rb").read()
            blob = os.path.join(cache, "blobs", hashlib.sha256(data).hexdigest())
            with open(blob, "wb") as handle:
                handle.write(data)
            link = os.path.join(snapshot, os.path.relpath(source, model_dir))
            os.makedirs(os.path.dirname(link), exist_ok=True)
            os.symlink(os.path.relpath(blob, os.path.dirname(link)), link)
    with open(os.path.join(cache, "refs", "main"), "w") as handle:
        handle.write(commit)
    return snapshot
