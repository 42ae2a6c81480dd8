"""Every file the options name is checked before any model is built: a missing dataset or model directory is
one error line, and the builders of the embedded model and demo assets were never called."""

from __future__ import annotations

import json

import pytest

from coati import cli
from coati.config.run import RunConfig
from coati.demo import math_demo
from coati.rlhf import pipeline
from coati.rlhf.pipeline import Plan, ppo_values, stage_config


@pytest.fixture
def builders(monkeypatch):
    """Spies on every builder of the embedded models: any call is recorded and fails the command."""
    calls = []

    def spy(name):
        def build(*args, **kwargs):
            calls.append(name)
            raise AssertionError(f"{name} was called before the inputs were checked")
        return build

    for name in ("ensure_base_model", "ensure_demo_assets"):
        monkeypatch.setattr(math_demo, name, spy(name))
    from coati.demo import code_demo

    monkeypatch.setattr(code_demo, "ensure_code_demo_assets", spy("ensure_code_demo_assets"))
    return calls


@pytest.mark.parametrize("argv, message", [
    (["sft", "-d", "nothing.jsonl"], "dataset file not found: nothing.jsonl"),
    (["rm", "-d", "nothing.jsonl"], "dataset file not found: nothing.jsonl"),
    (["sft", "-m", "no/such/model"], "model directory not found or without config.json: no/such/model"),
    (["sft", "-ed", "gone.jsonl"], "-ed/--eval-dataset not found: gone.jsonl"),
    (["train", "--resume", "runs/demo/step_9"], "--resume not found: runs/demo/step_9"),
    (["evaluate", "-d", "nothing.jsonl"], "dataset file not found: nothing.jsonl"),
    (["train", "-d", "nothing.jsonl"], "-d/--dataset not found: nothing.jsonl"),
    (["train", "-rt", "code", "-d", "nothing.jsonl"], "-d/--dataset not found: nothing.jsonl"),
    (["train", "-ed", '{"math": "gone.jsonl"}'], "-ed/--eval-dataset file for task 'math' not found: gone.jsonl"),
    (["ppo", "-d", "nothing.jsonl", "--reward-model", "rm"], "-d/--dataset not found: nothing.jsonl"),
])
def test_a_missing_input_stops_before_any_model_is_built(argv, message, builders, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = cli.main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: ") and "\n" not in err and message in err, err
    assert builders == []


def test_the_pipeline_checks_the_ppo_data_and_the_top_model_before_the_first_stage(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(pipeline, "run_stage", None, raising=False)  # nothing may train
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.jsonl").write_text(json.dumps({"prompt": "1+1=", "completion": "2"}) + "\n")
    path = tmp_path / "rlhf.yaml"
    path.write_text("stages: [sft, ppo]\nsft: {dataset: a.jsonl}\nppo: {dataset: gone.jsonl, reward_model: r}\n")
    assert pipeline.main(["--config", str(path)]) == 2
    assert "section 'ppo': -d/--dataset not found: gone.jsonl" in capsys.readouterr().err
    # (a two-part name would be a hub name, resolved through the Hugging Face cache: tests/utils/test_hub.py)
    path.write_text("model: no/base/model\nstages: [sft]\nsft: {dataset: a.jsonl}\n")
    assert pipeline.main(["--config", str(path)]) == 2
    assert "model directory not found or without config.json: no/base/model" in capsys.readouterr().err


def test_the_top_level_model_starts_whichever_stage_comes_first(tmp_path):
    sections = {"sft": {"dataset": "s.jsonl"}, "rm": {"dataset": "r.jsonl"}, "ppo": {"dataset": "q.jsonl"}}
    plan = Plan(save_dir=str(tmp_path), model="base", stages=("rm", "ppo"), sections=sections)
    assert stage_config(plan, "rm").model == "base"
    values = ppo_values(plan)
    assert values["model"] == "base" and values["reward_model"] == plan.output("rm")
    full = Plan(save_dir=str(tmp_path), model="base", sections=sections)
    assert stage_config(full, "sft").model == "base" and stage_config(full, "rm").model == full.output("sft")


def test_checkpoints_are_periodic_by_default():
    from coati.config.cli import build_parser, config_from_args
    from coati.train import placeholder_demo

    assert RunConfig().save_interval == 50
    assert config_from_args(build_parser().parse_args([]), placeholder_demo()).run.save_interval == 50
    assert config_from_args(build_parser().parse_args(["-si", "0"]), placeholder_demo()).run.save_interval == 0
