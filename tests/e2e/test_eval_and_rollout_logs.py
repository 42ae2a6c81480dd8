"""-ei / -esd / -rsd end to end on a real local Ray cluster: evaluations at 0, every N steps and the end on
exactly the weights of those steps, their files and summary, and the rollout logs."""

import json
import os

import pytest
import ray

import coati.utils.run_files as run_files
from coati.config.cli import build_parser, config_from_args
from coati.dataset.jsonl import build_prompt, load_jsonl
from coati.launcher.preflight import check_inputs
from coati.launcher.rl import run
from coati.rollout.evaluation import evaluate
from coati.rollout.inference_backend import TransformersBackend
from rewards.scorer import RewardScorer
from tests.run_helpers import head


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
            "-tMbs", "8", "-tmbs", "32", "-e", "1", "-sd", str(tmp_path / "runs"), "-p", "t", "--no-progress",
            "-ei", "3", "-si", "3", "-esd", str(tmp_path / "evals"), "-rsd", str(tmp_path / "rollouts"),
            "--rollout-save-interval", "2"]
    config = config_from_args(build_parser().parse_args(argv), demo_assets)
    check_inputs(config)
    messages = []
    try:
        result = run(config, log=messages.append)
    finally:
        ray.shutdown()
    assert result.steps == 8 and config.steps_per_sync == 2  # 4 rounds of 2 steps; v1 after step 2, ...

    rows = read_jsonl(result.metrics_path)
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
