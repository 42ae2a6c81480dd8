"""Stopping real runs with real signals: ``python rl_example.py`` and ``coati sft`` in a child process (its own
session, so that a signal to its process group is what a terminal's Ctrl-C sends), then the resume to the end.

Every RL run: 24 prompts, -ibs 8 x -g 2, 4 groups a step: 3 rounds of 2 steps (round-level minibatches: a stop can
land inside a round), 6 steps, a held-out set of 8 prompts. A run of the tiny model takes a fraction of a second a
step, so a signal sent once a step is seen could land after the last one: the runs score with a reward of the
test's own that holds the next round's scoring until the signal is sent (``run_helpers.Gate``).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time

import pytest

from tests.ray_nodes import clean_env
from tests.run_helpers import ROOT, Gate, head

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]
STEPS = 6


def start(argv: list[str], demo_assets) -> subprocess.Popen:
    env = clean_env(COATI_CACHE=os.path.dirname(os.path.dirname(demo_assets.model_dir)))
    return subprocess.Popen([sys.executable, "rl_example.py", *argv], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def train_steps(run_dir) -> list[int]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [row["step"] for row in map(json.loads, path.read_text().splitlines()) if row["kind"] == "train"]


def wait_until(proc, done, timeout: float = 600) -> None:
    deadline = time.time() + timeout
    while not done():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.time() < deadline, "timed out"
        time.sleep(0.2)


def stopped(proc, code: int) -> list[str]:
    """The run's stderr lines once it exited with ``code``; no traceback, no line from Ray."""
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == code, err[-3000:]
    assert "Traceback" not in err + out and "(raylet)" not in out + err and "retried" not in out + err, err + out
    return [line for line in err.splitlines() if line.strip()]


def checkpoints(run_dir) -> list[int]:
    return sorted(int(name.split("_")[1]) for name in os.listdir(run_dir) if name.startswith("step_")
                  and (run_dir / name / "checkpoint_complete.json").exists())


@pytest.fixture
def argv(demo_assets, tmp_path):
    train = head(demo_assets.train_path, tmp_path / "train.jsonl", 24)
    evals = head(demo_assets.eval_path, tmp_path / "eval.jsonl", 8)
    return ["-d", train, "-ed", json.dumps({"add": evals}), "-ibs", "8", "-imbs", "8", "-g", "2", "-tbs", "4",
            "-tMbs", "4", "-tmbs", "8", "-mnt", "8", "-e", "1", "-sd", str(tmp_path / "runs"), "-p", "x", "--no-progress"]


def resume_to_the_end(demo_assets, run_dir, tmp_path, monkeypatch) -> None:
    """The resumed run to its end, here in this process as the SFT test below does (its signals are the child
    runs' part): no second interpreter and imports."""
    import ray

    import rl_example

    monkeypatch.setenv("COATI_CACHE", os.path.dirname(os.path.dirname(demo_assets.model_dir)))
    for key in [key for key in os.environ if key.startswith("RAY_")]:  # a local run, as the child's clean_env
        monkeypatch.delenv(key)
    try:
        assert rl_example.main(["-sd", str(tmp_path / "runs"), "-p", "x", "--resume", "latest", "--no-progress"]) == 0
    finally:
        ray.shutdown()
    assert train_steps(run_dir) == list(range(1, STEPS + 1))  # none lost, none twice
    assert checkpoints(run_dir)[-1] == STEPS


def test_ctrl_c_saves_a_second_ctrl_c_exits_and_resume_finishes(demo_assets, argv, tmp_path, monkeypatch):
    run_dir = tmp_path / "runs" / "x"
    gate = Gate(tmp_path, run_dir)
    gate.close(after=1)  # round 2 is scored after step 1's row: steps 1 and 2 train, step 3 waits
    proc = start(argv + gate.flags, demo_assets)
    wait_until(proc, lambda: len(train_steps(run_dir)) >= 2)
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the driver's whole process group
    gate.open()  # the step under way ends, and the run stops after it (step 2 or 3)
    lines = stopped(proc, 130)
    reached = max(train_steps(run_dir))
    resume = f"continue with: python rl_example.py -sd {tmp_path / 'runs'} -p x --resume latest"
    assert lines == [f"SIGINT: stopped after step {reached}, saved {run_dir / f'step_{reached}'}; {resume}"]
    assert checkpoints(run_dir) == [reached] and reached < STEPS

    # The resumed run, signalled twice in its second step: it exits at once, the newest checkpoint as it was. Two
    # signals of one kind that arrive before the driver runs its handler count as one (a loaded machine may not
    # run it for a while), two kinds never: both wait while the driver is stopped, then arrive in one go.
    # Held before it could finish: from a round's end (step 2) it scores the next round first, so held after its
    # first row it trains steps 3 and 4 at most; from inside a round (step 3) it trains step 4 from the checkpoint's
    # round, held at once.
    gate.close(after=reached + 1 if reached % 2 == 0 else reached)
    proc = start(["-sd", str(tmp_path / "runs"), "-p", "x", "--resume", "latest", "--no-progress"], demo_assets)
    wait_until(proc, lambda: max(train_steps(run_dir)) > reached)
    proc.send_signal(signal.SIGSTOP)
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGTERM)
    proc.send_signal(signal.SIGCONT)
    lines = stopped(proc, 143)
    gate.open()
    assert lines[-1] == ("SIGTERM, a second signal: exiting now; no checkpoint was written for the steps since the "
                         f"newest one (the newest is {run_dir / f'step_{reached}'})"), lines
    assert checkpoints(run_dir) == [reached]

    resume_to_the_end(demo_assets, run_dir, tmp_path, monkeypatch)


def test_colocated_run_stops_on_sigterm_and_resumes(demo_assets, argv, tmp_path):
    """--colocate: the trainer ranks generate. A SIGTERM while the actors start (before the first evaluation is
    done) ends with one line and nothing to save; one to the driver alone mid-run saves and exits 143."""
    run_dir = tmp_path / "runs" / "x"
    proc = start(argv + ["--colocate"], demo_assets)
    wait_until(proc, lambda: (run_dir / "placement.json").exists())  # the actors are up, loading or evaluating
    proc.send_signal(signal.SIGTERM)
    assert stopped(proc, 143) == ["SIGTERM: stopped before any step was trained; no checkpoint to continue from: "
                                  "start the run again"]
    assert train_steps(run_dir) == [] and checkpoints(run_dir) == []

    gate = Gate(tmp_path, run_dir)
    gate.close(after=1)  # the ranks score round 2 after step 1's row: step 3 waits
    proc = start(argv + ["--colocate"] + gate.flags, demo_assets)
    wait_until(proc, lambda: len(train_steps(run_dir)) >= 1)
    proc.send_signal(signal.SIGTERM)  # as `kill PID` or a scheduler's preemption
    gate.open()
    lines = stopped(proc, 143)
    reached = max(train_steps(run_dir))
    assert len(lines) == 1 and lines[0].startswith(f"SIGTERM: stopped after step {reached}, saved ")
    assert checkpoints(run_dir) == [reached] and reached < STEPS
    # resuming it is the first test's (and tests/trainer/test_colocated.py's colocated resume, exact)


def test_coati_sft_stops_on_ctrl_c_with_a_checkpoint_and_its_line_resumes_it(tiny_model_dir, tmp_path, monkeypatch):
    """The SFT stage runs through the same loop: a terminal's Ctrl-C mid-run saves the last finished step (with
    -si 0 too) and prints the one line whose command finishes the run (run here, in this process: no second
    start-up). The tiny model, 100 steps of 2 rows; no wandb, whose start alone costs seconds."""
    from coati import cli
    from coati.rlhf.dummy import write_dummy_data

    monkeypatch.setenv("WANDB_MODE", "disabled")
    data = write_dummy_data(str(tmp_path / "data"), num_sft=200, num_pairs=8, num_eval=8)
    run_dir = tmp_path / "runs" / "s"
    argv = ["-m", tiny_model_dir, "-d", data["sft"], "-ed", data["sft_eval"], "-bs", "2", "-tmbs", "2", "-si", "0",
            "--no-progress", "-sd", str(tmp_path / "runs"), "-p", "s"]
    proc = subprocess.Popen([sys.executable, "-m", "coati.cli", "sft", *argv], cwd=ROOT, env=clean_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    wait_until(proc, lambda: len(train_steps(run_dir)) >= 2)
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130 and "Traceback" not in out + err, err[-3000:]
    reached = max(train_steps(run_dir))
    # the one line (the rest of stderr: transformers' bars of the model loads)
    lines = [line for line in err.splitlines() if "SIGINT" in line or "continue with" in line]
    resume = shlex.join(["coati", "sft", *argv, "--resume", "latest"])
    assert lines == [f"SIGINT: stopped after step {reached}, saved {run_dir / f'step_{reached}'}; continue with: "
                     f"{resume}"]
    assert checkpoints(run_dir) == [reached] and reached < 100 and train_steps(run_dir) == list(range(1, reached + 1))
    assert not (run_dir / "final").exists()

    command = shlex.split(lines[0].split("continue with: ")[1])
    assert command[:2] == ["coati", "sft"] and cli.main(command[1:]) == 0
    assert train_steps(run_dir) == list(range(1, 101))  # none lost, none twice
    assert (run_dir / "final" / "config.json").exists()
