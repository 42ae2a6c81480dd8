"""The RL run's optimizer knobs on the SFT/RM stages: the learning-rate schedule with its warm-up over the
stage's steps (a resumed run continues it), weight decay on the stage's AdamW, gradient checkpointing."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

import pytest
import torch

from coati.config.optim import OptimConfig
from coati.config.stage import RMConfig, SFTConfig
from coati.launcher.stage import run_stage
from coati.plugins.optim import lr_multiplier
from coati.rlhf.dummy import write_dummy_data


@pytest.fixture(autouse=True)
def no_wandb(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")


def train_rows(run_dir: str) -> dict[int, dict]:
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl")) if line.strip()]
    return {row["step"]: row for row in rows if row.get("kind") == "train"}


def test_the_schedule_and_warm_up_span_the_stages_steps_and_survive_a_resume(tiny_model_dir, tmp_path):
    data = write_dummy_data(str(tmp_path / "data"), num_sft=96, num_pairs=8, num_eval=8)
    optim = OptimConfig(lr_scheduler="linear", lr_warmup_steps=2)
    config = SFTConfig(model=tiny_model_dir, dataset=data["sft"], eval_fraction=0, save_dir=str(tmp_path / "runs"),
                       project="whole", batch_size=16, micro_batch_size=16, learning_rate=1e-3, save_interval=3,
                       progress_bar=False, optim=optim)
    whole = run_stage(config, config.dataset, None, config.model, log=lambda line: None)
    rows = train_rows(config.run_dir)
    assert sorted(rows) == [1, 2, 3, 4, 5, 6]
    for step, row in rows.items():  # step N trains at the multiplier of 0-based step N - 1 of 6
        assert row["lr"] == pytest.approx(1e-3 * lr_multiplier(step - 1, 6, 2, "linear"), rel=1e-12, abs=0)
    assert rows[1]["lr"] == 0.0 and rows[3]["lr"] == 1e-3 and rows[6]["lr"] < rows[4]["lr"]
    stopped = dataclasses.replace(config, project="stopped", resume="latest")
    os.makedirs(stopped.run_dir)
    shutil.copytree(os.path.join(config.run_dir, "step_3"), os.path.join(stopped.run_dir, "step_3"))
    resumed = run_stage(stopped, config.dataset, None, config.model, log=lambda line: None)
    again = train_rows(stopped.run_dir)
    assert [again[step]["lr"] for step in (4, 5, 6)] == [rows[step]["lr"] for step in (4, 5, 6)]
    from transformers import AutoModelForCausalLM

    expected, got = (AutoModelForCausalLM.from_pretrained(r.model_dir).state_dict() for r in (whole, resumed))
    assert all(torch.equal(expected[name], got[name]) for name in expected)


def one_step(tiny_model_dir, data, cls, optim: OptimConfig):
    """A stage rank in this process after one step: (its step metrics, the rank)."""
    from coati.trainer.stage_rank import StageRank

    config = cls(model=tiny_model_dir, eval_fraction=0, batch_size=8, micro_batch_size=4, learning_rate=1e-2,
                 progress_bar=False, optim=optim)
    rank = StageRank(config, data, None, tiny_model_dir)
    rank.setup()
    try:
        return rank.step(0), rank
    finally:
        rank.shutdown()


def test_weight_decay_shrinks_the_matrices_only(tiny_model_dir, tmp_path):
    data = write_dummy_data(str(tmp_path / "data"), num_sft=8, num_pairs=8, num_eval=8)["preferences"]
    plain, plain_rank = one_step(tiny_model_dir, data, RMConfig, OptimConfig())
    decayed, decayed_rank = one_step(tiny_model_dir, data, RMConfig, OptimConfig(weight_decay=0.5))
    assert decayed["loss"] == plain["loss"]  # the first forward sees the same weights
    a, b = plain_rank.full_state(), decayed_rank.full_state()
    matrix, norm = "model.layers.0.mlp.up_proj.weight", "model.layers.0.input_layernorm.weight"
    # AdamW's decoupled decay: the decayed run's matrix is the plain one's minus lr * wd * (the weight before)
    assert not torch.equal(a[matrix], b[matrix]) and torch.equal(a[norm], b[norm])


def test_gradient_checkpointing_recomputes_the_same_step(tiny_model_dir, tmp_path):
    data = write_dummy_data(str(tmp_path / "data"), num_sft=8, num_pairs=8, num_eval=8)["sft"]
    plain, plain_rank = one_step(tiny_model_dir, data, SFTConfig, OptimConfig())
    checkpointed, rank = one_step(tiny_model_dir, data, SFTConfig, OptimConfig(gradient_checkpointing=True))
    assert rank.plugin.module.is_gradient_checkpointing and not plain_rank.plugin.module.is_gradient_checkpointing
    assert checkpointed["loss"] == plain["loss"]
    assert checkpointed["grad_norm"] == pytest.approx(plain["grad_norm"], rel=1e-5)
