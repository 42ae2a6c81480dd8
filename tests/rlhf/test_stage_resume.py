"""``coati sft`` / ``coati rm`` checkpoints: every -si steps (the newest kept), and --resume (a path or latest)
continues to the same weights an uninterrupted run reaches; a checkpoint of other batch options is one line."""

from __future__ import annotations

import dataclasses
import os
import shutil

import pytest
import torch

from coati import cli
from coati.config.stage import SFTConfig
from coati.rlhf.dummy import write_dummy_data
from coati.launcher.stage import run_stage
from coati.utils.checkpoint import list_checkpoints


@pytest.fixture(autouse=True)
def no_wandb(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")


def weights(model_dir: str) -> dict:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir).state_dict()


def test_a_resumed_sft_run_ends_where_an_uninterrupted_one_does(tiny_model_dir, tmp_path):
    data = write_dummy_data(str(tmp_path / "data"), num_sft=96, num_pairs=8, num_eval=8)
    config = SFTConfig(model=tiny_model_dir, dataset=data["sft"], eval_dataset=data["sft_eval"],
                       save_dir=str(tmp_path / "runs"), project="whole", batch_size=16, micro_batch_size=16,
                       learning_rate=1e-3, save_interval=2, progress_bar=False)
    whole = run_stage(config, config.dataset, config.eval_dataset, config.model, log=lambda line: None)
    assert whole.steps == 6
    assert [step for step, _ in list_checkpoints(config.run_dir)] == [4]  # every 2 steps, the newest kept
    # a run stopped after step 4: its checkpoint copied into a fresh run directory
    stopped = dataclasses.replace(config, project="stopped")
    os.makedirs(stopped.run_dir)
    shutil.copytree(os.path.join(config.run_dir, "step_4"), os.path.join(stopped.run_dir, "step_4"))
    resumed = run_stage(dataclasses.replace(stopped, resume="latest"), config.dataset, config.eval_dataset,
                        config.model, log=lambda line: None)
    expected, got = weights(whole.model_dir), weights(resumed.model_dir)
    assert all(torch.allclose(expected[name], got[name], atol=1e-6) for name in expected)
    assert resumed.before == whole.before  # the held-out metrics before training travel with the checkpoint


def test_a_stage_checkpoint_with_its_state_directly_in_trainer_state_resumes(tiny_model_dir, tmp_path):
    """Stage checkpoints hold the trained model's state under trainer_state/actor/, as run checkpoints do; those
    that hold it directly in trainer_state/ (written before) resume to the same weights."""
    data = write_dummy_data(str(tmp_path / "data"), num_sft=48, num_pairs=8, num_eval=8)
    config = SFTConfig(model=tiny_model_dir, dataset=data["sft"], eval_dataset=data["sft_eval"],
                       save_dir=str(tmp_path / "runs"), project="whole", batch_size=16, micro_batch_size=16,
                       learning_rate=1e-3, save_interval=2, progress_bar=False)
    whole = run_stage(config, config.dataset, config.eval_dataset, config.model, log=lambda line: None)
    assert whole.steps == 3 and [step for step, _ in list_checkpoints(config.run_dir)] == [2]
    flat = dataclasses.replace(config, project="flat")
    state = os.path.join(flat.run_dir, "step_2", "trainer_state")
    shutil.copytree(os.path.join(config.run_dir, "step_2"), os.path.dirname(state))
    role = os.path.join(state, "actor")
    for name in os.listdir(role):
        shutil.move(os.path.join(role, name), state)
    os.rmdir(role)
    resumed = run_stage(dataclasses.replace(flat, resume="latest"), config.dataset, config.eval_dataset,
                        config.model, log=lambda line: None)
    expected, got = weights(whole.model_dir), weights(resumed.model_dir)
    assert all(torch.allclose(expected[name], got[name], atol=1e-6) for name in expected)


def test_resume_problems_are_one_line_before_any_model(tmp_path, capsys, monkeypatch):
    from coati.demo import math_demo

    monkeypatch.setattr(math_demo, "ensure_base_model", lambda *a, **k: pytest.fail("built a model"))
    monkeypatch.chdir(tmp_path)
    assert cli.main(["sft", "--resume", "latest", "-sd", str(tmp_path)]) == 2
    assert "--resume latest: no complete checkpoint under" in capsys.readouterr().err
    from coati.launcher import stage_checkpoint

    class Group:
        def call(self, *args):
            return None

    config = SFTConfig(save_dir=str(tmp_path), batch_size=16)
    stage_checkpoint.save(Group(), config, 2, {})
    assert cli.main(["sft", "--resume", "latest", "-sd", str(tmp_path), "-bs", "8", "-tmbs", "8"]) == 2
    err = capsys.readouterr().err.strip()
    assert "must keep the options that choose its batches; changed: batch_size 16 -> 8" in err and "\n" not in err


def test_the_pipeline_resumes_from_the_stage_it_stopped_in(tmp_path, monkeypatch):
    import json

    from coati.launcher import stage_checkpoint
    from coati.rlhf import pipeline
    from coati.rlhf.pipeline import Plan, ppo_values

    data = write_dummy_data(str(tmp_path / "data"), num_sft=64, num_pairs=64, num_eval=8)
    plan = Plan(save_dir=str(tmp_path), project="p", stages=("sft", "rm"), resume=True,
                sections={"sft": {"dataset": data["sft"]}, "rm": {"dataset": data["preferences"], "batch_size": 16},
                          "ppo": {}})
    final = os.path.join(plan.stage_dir("sft"), "final")  # sft finished
    os.makedirs(final)
    for path in (os.path.join(final, "config.json"), os.path.join(plan.stage_dir("sft"), "stage_config.json")):
        with open(path, "w") as handle:
            json.dump({}, handle)

    class Group:
        def call(self, *args):
            return None

    rm = pipeline.stage_config(plan, "rm")  # rm stopped after its step 2
    stage_checkpoint.save(Group(), rm, 2, {})
    trained = []
    monkeypatch.setattr("coati.launcher.stage.run_stage", lambda config, *args, **kwargs: trained.append(config))
    monkeypatch.setattr("coati.rlhf.cli.resolve_inputs", lambda config, log=None: ("m", "t", None))
    pipeline.run_pipeline(plan, log=lambda line: None)
    assert [(config.stage, config.resume) for config in trained] == [("rm", "latest")]
    assert ppo_values(plan).get("resume") is None  # no ppo checkpoint: a fresh start
    plan.resume = False
    trained.clear()
    pipeline.run_pipeline(plan, log=lambda line: None)
    assert [(config.stage, config.resume) for config in trained] == [("sft", None), ("rm", None)]


@pytest.mark.e2e
def test_a_reward_model_checkpoint_of_fsdp2_x2_resumes_in_one_process(tiny_model_dir, tmp_path):
    """Ray actors write their shards; one process reads them back (another layout) and ends where the two-rank
    run ended."""
    import ray
    from transformers import AutoModelForSequenceClassification

    from coati.config.stage import RMConfig

    data = write_dummy_data(str(tmp_path / "data"), num_sft=8, num_pairs=48, num_eval=8)
    config = RMConfig(model=tiny_model_dir, dataset=data["preferences"], save_dir=str(tmp_path / "runs"),
                      project="two", batch_size=8, micro_batch_size=4, eval_fraction=0, learning_rate=1e-4,
                      save_interval=4, num_trainers=2, zero_stage=2, progress_bar=False)
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        whole = run_stage(config, config.dataset, None, config.model, log=lambda line: None)
    finally:
        ray.shutdown()
    assert whole.steps == 6 and [step for step, _ in list_checkpoints(config.run_dir)] == [4]
    one = dataclasses.replace(config, project="one", num_trainers=1, zero_stage=0,
                              resume=os.path.join(config.run_dir, "step_4"))
    resumed = run_stage(one, config.dataset, None, config.model, log=lambda line: None)

    def params(path):
        return dict(AutoModelForSequenceClassification.from_pretrained(path).named_parameters())

    expected, got = params(whole.model_dir), params(resumed.model_dir)
    diff = max(float((expected[name] - got[name]).abs().max()) for name in expected)
    assert diff <= 1e-5, diff


def test_lora_stages_write_merged_models_and_resume_exactly(tiny_model_dir, tmp_path):
    """coati sft / rm with --lora-rank: the base stays frozen (the embedding is the base's), the final directory is
    the merged model (the reward model's head trained in full) with the adapter beside it, and a resumed run
    reaches the same weights."""
    from transformers import AutoModelForSequenceClassification

    from coati.config.lora import LoraConfig
    from coati.models.lora import is_adapter_dir
    from coati.config.stage import RMConfig
    from coati.trainer.stage_rank import ADAPTER_SUBDIR

    lora = LoraConfig(lora_rank=4, lora_alpha=8.0)
    data = write_dummy_data(str(tmp_path / "data"), num_sft=96, num_pairs=32, num_eval=8)
    config = SFTConfig(model=tiny_model_dir, dataset=data["sft"], eval_dataset=data["sft_eval"],
                       save_dir=str(tmp_path / "runs"), project="whole", batch_size=16, micro_batch_size=16,
                       learning_rate=1e-2, save_interval=2, progress_bar=False, lora=lora)
    whole = run_stage(config, config.dataset, config.eval_dataset, config.model, log=lambda line: None)
    assert whole.steps == 6 and whole.after["eval_loss"] < whole.before["eval_loss"]
    assert is_adapter_dir(os.path.join(whole.model_dir, ADAPTER_SUBDIR))
    base, merged = weights(tiny_model_dir), weights(whole.model_dir)
    assert torch.equal(base["model.embed_tokens.weight"], merged["model.embed_tokens.weight"])  # frozen
    assert not torch.equal(base["model.layers.0.self_attn.q_proj.weight"], merged["model.layers.0.self_attn.q_proj.weight"])
    stopped = dataclasses.replace(config, project="stopped")
    os.makedirs(stopped.run_dir)
    shutil.copytree(os.path.join(config.run_dir, "step_4"), os.path.join(stopped.run_dir, "step_4"))
    resumed = run_stage(dataclasses.replace(stopped, resume="latest"), config.dataset, config.eval_dataset,
                        config.model, log=lambda line: None)
    got = weights(resumed.model_dir)
    assert all(torch.allclose(merged[name], got[name], atol=1e-6) for name in merged)

    rm = RMConfig(model=whole.model_dir, dataset=data["preferences"], eval_dataset=data["preferences_eval"],
                  save_dir=str(tmp_path / "runs"), project="rm", batch_size=8, micro_batch_size=8, learning_rate=1e-2,
                  progress_bar=False, lora=lora)
    result = run_stage(rm, rm.dataset, rm.eval_dataset, rm.model, log=lambda line: None)
    model = AutoModelForSequenceClassification.from_pretrained(result.model_dir)
    assert is_adapter_dir(os.path.join(result.model_dir, ADAPTER_SUBDIR))
    assert model.score.weight.abs().sum() > 0 and torch.isfinite(model.score.weight).all()
