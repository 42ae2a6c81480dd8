"""``coati rm``, and ``coati rlhf`` in its rm stage, stopped by a real signal sent from inside a step, in this
process through the CLI: exit 130/143, one line naming the checkpoint of the last finished step and the command
that continues, and that command ends where an uninterrupted run ends. ``coati sft`` in a child process, as a
terminal's Ctrl-C: tests/e2e/test_interrupts.py."""

from __future__ import annotations

import json
import os
import shlex
import signal
import time

import pytest
import torch

from coati import cli
from coati.rlhf.dummy import write_dummy_data
from coati.trainer.stage_rank import StageRank


@pytest.fixture(autouse=True)
def no_wandb(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")


def train_steps(run_dir: str) -> list[int]:
    with open(os.path.join(run_dir, "metrics.jsonl")) as handle:
        return [row["step"] for row in map(json.loads, handle) if row["kind"] == "train"]


def scores(model_dir: str) -> dict:
    from transformers import AutoModelForSequenceClassification

    return AutoModelForSequenceClassification.from_pretrained(model_dir).state_dict()


def test_coati_rm_stops_on_sigint_with_a_checkpoint_and_resumes_to_the_same_model(tiny_model_dir, tmp_path,
                                                                                 monkeypatch, capsys):
    data = write_dummy_data(str(tmp_path / "data"), num_sft=8, num_pairs=48, num_eval=8)
    argv = ["-m", tiny_model_dir, "-d", data["preferences"], "-ed", data["preferences_eval"], "-bs", "8",
            "-tmbs", "8", "-lr", "1e-3", "-si", "4", "--no-progress", "-sd", str(tmp_path / "runs")]
    assert cli.main(["rm", *argv, "-p", "whole"]) == 0  # 6 steps, uninterrupted
    whole = scores(str(tmp_path / "runs" / "whole" / "final"))
    capsys.readouterr()

    real_step = StageRank.step

    def step_then_ctrl_c(self, step: int) -> dict:
        row = real_step(self, step)
        if step == 2:  # the third step: before -si 4 saves anything
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # the handler runs here, inside the step
        return row

    monkeypatch.setattr(StageRank, "step", step_then_ctrl_c)
    run_dir = tmp_path / "runs" / "cut"
    assert cli.main(["rm", *argv, "-p", "cut"]) == 130
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    # the one line (before it, only the model loads' progress bars of transformers)
    lines = [line for line in err.splitlines() if "SIGINT" in line or "continue with" in line]
    resume = shlex.join(["coati", "rm", *argv, "-p", "cut", "--resume", "latest"])
    assert lines == [f"SIGINT: stopped after step 3, saved {run_dir / 'step_3'}; continue with: {resume}"]
    assert sorted(os.listdir(run_dir)) == ["metrics.jsonl", "step_3"]  # no final model
    assert train_steps(str(run_dir)) == [1, 2, 3]

    monkeypatch.setattr(StageRank, "step", real_step)
    command = shlex.split(lines[0].split("continue with: ")[1])
    assert command[:2] == ["coati", "rm"] and cli.main(command[1:]) == 0
    assert train_steps(str(run_dir)) == [1, 2, 3, 4, 5, 6]  # none lost, none twice
    got = scores(str(run_dir / "final"))
    assert all(torch.allclose(whole[name], got[name], atol=1e-6) for name in whole)


def test_coati_rlhf_stopped_in_its_rm_stage_says_so_and_resume_finishes_it(tiny_model_dir, tmp_path, monkeypatch,
                                                                           capsys):
    from coati.rlhf import pipeline

    data = write_dummy_data(str(tmp_path / "data"), num_sft=8, num_pairs=48, num_eval=8)
    plan = tmp_path / "rlhf.yaml"
    plan.write_text(json.dumps({"save_dir": str(tmp_path / "runs"), "project": "p", "model": tiny_model_dir,
                                "stages": ["rm"], "rm": {"dataset": data["preferences"], "batch_size": 8,
                                                         "micro_batch_size": 8, "eval_fraction": 0,
                                                         "save_interval": 0, "progress_bar": False}}))
    real_step = StageRank.step

    def step_then_sigterm(self, step: int) -> dict:
        row = real_step(self, step)
        if step == 1:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
        return row

    monkeypatch.setattr(StageRank, "step", step_then_sigterm)
    assert pipeline.main(["--config", str(plan)]) == 143
    run_dir = tmp_path / "runs" / "p" / "rm"
    lines = [line for line in capsys.readouterr().err.splitlines() if "SIGTERM" in line]
    assert lines == [f"SIGTERM: stopped after step 2, saved {run_dir / 'step_2'}; continue with: coati rlhf --config "
                     f"{plan} --resume"]
    monkeypatch.setattr(StageRank, "step", real_step)
    assert pipeline.main(["--config", str(plan), "--resume"]) == 0
    assert train_steps(str(run_dir)) == [1, 2, 3, 4, 5, 6]
