"""A short GRPO run end to end on a real local Ray cluster (8 steps, KL to the reference): what every step logs,
the weight versions and their delivery check, and -ei / -esd / -rsd: evaluations at 0, every N steps and the end
on exactly the weights of those steps, their files and summary, and the rollout logs; then --resume of the
finished run is refused."""

import json
import os

import pytest
import torch
from transformers import AutoModelForCausalLM

import coati.utils.run_files as run_files
from coati.config.cli import build_parser, config_from_args
from coati.config.errors import ConfigError
from coati.dataset.jsonl import build_prompt, load_jsonl
from coati.launcher.checkpoints import NothingToResume
from coati.launcher.preflight import check_inputs
from coati.rollout.evaluation import evaluate
from coati.rollout.inference_backend import TransformersBackend
from rewards.scorer import RewardScorer
from tests.run_helpers import head, run_in_module_ray


def read_jsonl(path):
    return [json.loads(line) for line in open(path)]


def greedy_responses(model_dir, eval_path, config):
    """The held-out greedy answers of a saved checkpoint, computed here in the test process."""
    backend = TransformersBackend.from_pretrained(model_dir, config.batch.inference_microbatch_size)
    examples = load_jsonl(eval_path, "boxed")
    prompts = [backend.tokenizer(build_prompt(backend.tokenizer, e.messages, ""), add_special_tokens=False).input_ids
               for e in examples]
    params = dict(config.eval_sampling)["greedy"]
    return [r["response"] for r in evaluate(backend, prompts, examples, RewardScorer("boxed"), params).records]


@pytest.mark.e2e
@pytest.mark.timeout(400)
def test_eval_every_n_steps_and_rollout_logs(demo_assets, tmp_path, monkeypatch):
    monkeypatch.setattr(run_files, "ROLLOUT_FILE_BYTES", 1)  # rotate after every logged step
    train = head(demo_assets.train_path, tmp_path / "train.jsonl", 64)
    evals = head(demo_assets.eval_path, tmp_path / "eval.jsonl", 16)
    argv = ["-d", train, "-ed", json.dumps({"add": evals}), "-ibs", "16", "-imbs", "16", "-g", "4", "-tbs", "8",
            "-tMbs", "4", "-tmbs", "8", "-e", "1", "-sd", str(tmp_path / "runs"), "-p", "t", "--no-progress",
            "-kl", "0.05", "-ei", "3", "-si", "3", "-esd", str(tmp_path / "evals"), "-rsd", str(tmp_path / "rollouts"),
            "--rollout-save-interval", "2"]
    config = config_from_args(build_parser().parse_args(argv), demo_assets)
    check_inputs(config)
    messages = []
    result = run_in_module_ray(config, log=messages.append)
    assert result.steps == 8 and config.steps_per_sync == 2  # 4 rounds of 2 steps; v1 after step 2, ...

    rows = read_jsonl(result.metrics_path)
    train_rows = [r for r in rows if r["kind"] == "train"]
    assert [r["step"] for r in train_rows] == list(range(1, 9))
    for key in ("loss", "kl", "reward", "accuracy", "grad_norm", "clip_fraction", "response_length", "weight_version"):
        assert all(key in r for r in train_rows), key
    assert train_rows[-1]["weight_version"] == 4
    assert train_rows[0]["kl"] == pytest.approx(0.0, abs=1e-6)  # the policy starts at the reference
    assert train_rows[-1]["kl"] > 0
    # Sync mode: the data of steps 1-2 came from version 0, steps 3-4 from version 1, ...
    assert all(r["policy_lag"] == 0 for r in train_rows)
    # each version is checked at its first step, where the trainer's weights are exactly it: fp32 noise only
    checked = {r["step"]: (r["delivery_version"], r["delivery_gap"]) for r in train_rows if "delivery_gap" in r}
    assert sorted(checked) == [1, 3, 5, 7] and [v for v, _ in checked.values()] == [0, 1, 2, 3], checked
    assert max(gap for _, gap in checked.values()) < 1e-4, checked
    # there, too, the behaviour-vs-trainer mismatch is the numeric difference of generate() and the training forward
    firsts = [r for r in train_rows if r["step"] in checked]
    assert all(r["mismatch_k3"] < 1e-6 and r["mismatch_max_abs"] < 1e-3 and r["is_truncated"] == 0 for r in firsts)
    assert all(r["staleness_max"] == 0 for r in train_rows)
    assert [r["message"] for r in rows if r["kind"] == "health"] == []  # a healthy run: no run-health warning
    before = AutoModelForCausalLM.from_pretrained(demo_assets.model_dir).state_dict()
    after = AutoModelForCausalLM.from_pretrained(result.final_model_dir).state_dict()
    changed = [name for name in before if not torch.equal(before[name], after[name])]
    assert len(changed) == len(before), "every tensor should move after 8 Adam steps"

    eval_rows = [r for r in rows if r["kind"] == "eval"]
    # step 3 is mid-round: the snapshot holds training past v1; steps 6 and 8 end rounds (v3, v4)
    assert [(r["step"], r["mode"], r["version"], r["on_sync"]) for r in eval_rows] == [
        (0, "sampled", 0, True), (0, "greedy", 0, True), (3, "sampled", 1, False), (3, "greedy", 1, False),
        (6, "sampled", 3, True), (6, "greedy", 3, True), (8, "sampled", 4, True), (8, "greedy", 4, True)]
    assert all(r["count"] == 16 and 0 <= r["accuracy"] <= r["format_rate"] <= 1 for r in eval_rows)
    assert set(result.eval_before) == set(result.eval_after) == {"add/sampled", "add/greedy"}

    eval_dir = tmp_path / "evals" / "t"
    summary = json.load(open(eval_dir / "summary.json"))["results"]
    assert [(r["step"], r["mode"]) for r in summary] == [(s, m) for s in (0, 3, 6, 8) for m in ("greedy", "sampled")]
    for row in summary:
        records = read_jsonl(eval_dir / row["file"])
        assert len(records) == 16 and row["file"] == f"add_{row['mode']}_step{row['step']}.jsonl"
        assert sum(r["correct"] for r in records) / 16 == row["accuracy"]
        assert {"prompt", "response", "extracted", "reward"} <= set(records[0])
    # The evaluator saw exactly the weights of the step: its greedy answers are those of the checkpoint
    # saved at that step (-si 3 saves step_3 and step_6), here regenerated from the saved directory.
    for step in (3, 6, 8):
        ours = greedy_responses(str(tmp_path / "runs" / "t" / f"step_{step}"), evals, config)
        theirs = [r["response"] for r in read_jsonl(eval_dir / f"add_greedy_step{step}.jsonl")]
        assert ours == theirs, step

    # Round-level minibatches: a round's samples are logged once, whole, at its first step (1, 3, 5, 7), since
    # one of its steps (2, 4, 6, 8) is due under --rollout-save-interval 2.
    names = sorted(os.listdir(tmp_path / "rollouts" / "t"))
    assert names == [f"rollouts_step{s:06d}.jsonl" for s in (1, 3, 5, 7)]
    for name, step, version in zip(names, (1, 3, 5, 7), (0, 1, 2, 3)):
        records = read_jsonl(tmp_path / "rollouts" / "t" / name)
        assert len(records) == 16 * 4 and {r["step"] for r in records} == {step}
        assert {r["policy_version"] for r in records} == {version}  # the round trained on from that step
        for group in range(16):
            samples = records[group * 4 : group * 4 + 4]
            assert sum(r["advantage"] for r in samples) == pytest.approx(0, abs=1e-5)  # group-normalised
            assert all(r["kept"] and r["in_loss"] and r["prompt"] == samples[0]["prompt"] for r in samples)
            assert all(r["reward"] == pytest.approx(1.0 if r["correct"] else 0.1 if r["format_ok"] else 0.0)
                       for r in samples)
    assert any("eval step 3 add/greedy" in m and "+ training to step 3" in m for m in messages)

    # --resume of the finished run: refused before any actor starts; and where that count is not known before
    # the start (several generators, -mpt), the first step finds no group left and says so, adding no row
    metrics = open(result.metrics_path).read()
    again = config_from_args(build_parser().parse_args(argv + ["--resume", "latest"]), demo_assets)
    with pytest.raises(ConfigError, match=r"step_8: the run has no step left to train \(the checkpoint is at step 8; "
                                          r"this run plans at most 8\)"):
        check_inputs(again)
    with pytest.raises(NothingToResume, match=r"step_8: the run has no step left to train \(the checkpoint is at "
                                              r"step 8; every group of its data was drawn\)"):
        run_in_module_ray(again)
    assert open(result.metrics_path).read() == metrics
