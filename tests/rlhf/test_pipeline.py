"""``coati rlhf``: the pipeline file is read and every stage's options are checked before anything trains; the
links between stages (SFT output -> RM start and PPO policy, RM output -> PPO reward model) are filled in."""

from __future__ import annotations

import json

import pytest

from coati.rlhf import pipeline
from coati.rlhf.pipeline import Plan, PipelineError, ppo_config, ppo_values, read_plan, stage_config


def write(tmp_path, text: str) -> str:
    path = tmp_path / "rlhf.yaml"
    path.write_text(text)
    return str(path)


def test_links_between_stages_are_filled_in(tmp_path):
    plan = Plan(save_dir=str(tmp_path), project="p", model="base",
                sections={"sft": {"dataset": "s.jsonl", "system_prompt": "Be brief."}, "rm": {"dataset": "r.jsonl"},
                          "ppo": {"dataset": "q.jsonl", "kl_coef": 0.1}})
    assert stage_config(plan, "sft").model == "base"
    rm = stage_config(plan, "rm")
    assert rm.model == plan.output("sft") and rm.run_dir == str(tmp_path / "p" / "rm")
    config = ppo_config(plan, check_files=False)  # the section's options, built without flags
    assert config.algo.name == "PPO" and config.model.path == plan.output("sft")
    assert config.algo.ppo.reward_model == plan.output("rm") and config.algo.ppo.kl_reward_coef == 0.1
    assert config.data.system_prompt == "Be brief."  # PPO prompts as SFT saw them
    assert ppo_values(plan)["kl_coef"] == 0.1  # the section's own spelling, an older name of kl_reward_coef


def test_a_section_may_name_its_inputs(tmp_path):
    plan = Plan(stages=("ppo",), sections={"sft": {}, "rm": {}, "ppo": {"model": "m", "reward_model": "r"}})
    values = ppo_values(plan)
    assert values["model"] == "m" and values["reward_model"] == "r"


@pytest.mark.parametrize("text, message", [
    ("sft: {epochs: 1}\nppo_typo: {}\n", "unknown key 'ppo_typo'"),
    ("stages: [rm, sft]\n", "stages must be an ordered subset"),
    ("sft: [1, 2]\n", "section 'sft' must be a mapping"),
    ("sft: {dataset: a.jsonl, epoch: 2}\n", "section 'sft' has unknown option 'epoch'"),
    ("sft: {dataset: a.jsonl, batch_size: 0}\n", "-bs/--batch-size must be at least 1"),
    ("stages: [ppo]\nppo: {dataset: a.jsonl}\n", "needs model:"),
    ("stages: [ppo]\nppo: {model: m, dataset: a.jsonl}\n", "needs a score: pass --reward-model"),
    ("stages: [ppo]\nppo: {model: m, dataset: a.jsonl, reward_model: r, lam: 2}\n", "--lam in [0, 1]"),
    ("stages: [ppo]\nppo: {model: m, dataset: a.jsonl, reward_model: r, lamda: 1}\n", "option 'lamda', which `coati ppo` does not take (did you mean 'lam'?)"),
    ("stages: [ppo]\nppo: {model: m, dataset: a.jsonl, reward_model: r, lam: x}\n", "section 'ppo' key 'lam' must be float, got 'x'"),
    ("a: [\n", "not valid YAML"),
])
def test_bad_pipeline_files_give_one_line_before_any_training(tmp_path, capsys, monkeypatch, text, message):
    monkeypatch.setattr(pipeline, "run_stage", None, raising=False)  # nothing may train
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.jsonl").write_text(json.dumps({"prompt": "1+1=", "completion": "2"}) + "\n")
    code = pipeline.main(["--config", write(tmp_path, text)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: ") and message in err and len(err.splitlines()) == 1, err


def test_missing_file_and_read_defaults(tmp_path):
    with pytest.raises(PipelineError, match="not found"):
        read_plan(str(tmp_path / "none.yaml"))
    plan = read_plan(write(tmp_path, "project: x\n"))
    assert plan.stages == ("sft", "rm", "ppo") and plan.project == "x" and plan.model is None
