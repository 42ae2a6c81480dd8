"""Learner-side generation (--learner-chunk-size N): prompt shards, start-up checks, on-policy groups, the run's
environment and reward model on the learner, and the data accounting of a real DAPO run over Ray with two
trainers, where only the sender generates (GRPO with one trainer: tests/trainer/test_resume.py, on its
learner-side reference run)."""

import json
import os

import pytest
import torch
from run_helpers import head, run_cli
from transformers import AutoModelForCausalLM

import rl_example
from coati.config.cli import build_parser, config_from_args
from coati.rollout.generation import prompt_shard
from coati.algorithm.batch import collate, token_logprobs
from coati.trainer.own_rounds import LearnerRounds

EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                       "examples", "calculator_env.py")


def write_rows(path, n):
    rows = [{"messages": {"role": "user", "content": f"{i}+1="}, "gt_answer": str(i + 1)} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_prompt_shards_by_hand():
    # Without learner generation: total // I each, the remainder unused (unchanged behaviour).
    assert [prompt_shard(103, 2, 8, 0, k) for k in range(2)] == [(0, 51), (51, 102)]
    # Weights 8, 8 (producers) and 4 (learner), sum 20: bounds 100*8/20, 100*16/20, 100.
    assert [prompt_shard(100, 2, 8, 4, k) for k in range(3)] == [(0, 40), (40, 80), (80, 100)]
    # 103 prompts: floor(103*8/20) = 41, floor(103*16/20) = 82; every shard still holds 5 rounds (41//8, 21//4).
    assert [prompt_shard(103, 2, 8, 4, k) for k in range(3)] == [(0, 41), (41, 82), (82, 103)]
    with pytest.raises(ValueError):
        prompt_shard(100, 2, 8, 0, 2)  # no learner shard when N == 0


def cli_config(argv, tmp_path):
    return config_from_args(build_parser().parse_args(argv + ["-sd", str(tmp_path / "runs"), "--no-progress"]))


def test_round_size_and_dataset_checks(tiny_model_dir, tmp_path, capsys):
    data = write_rows(tmp_path / "d.jsonl", 20)
    flags = ["-m", tiny_model_dir, "-d", data, "-ibs", "16", "-imbs", "16", "-g", "4", "-tbs", "8", "-tMbs", "8",
             "-tmbs", "8"]
    config = cli_config(flags + ["--learner-chunk-size", "8"], tmp_path)
    assert (config.groups_per_sync, config.steps_per_sync) == (24, 3)  # 16 producer + 8 learner groups a round
    assert rl_example.main(flags + ["--learner-chunk-size", "8"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "has 20 prompts: one round needs num_inferencer*ibs + --learner-chunk-size = 24" in err
    assert rl_example.main(flags + ["--learner-chunk-size", "4"]) == 2
    assert "(16 + 4 = 20) must be a multiple of data-parallel trainers*tbs (8)" in capsys.readouterr().err


def test_learner_groups_are_on_policy_with_the_loaded_weights(tiny_model_dir, tmp_path):
    """Groups sampled after loading weights that differ from the model on disk carry exactly the logprobs the
    trainer recomputes for those weights (right-padded, full forward) and the version they were tagged with."""
    data = write_rows(tmp_path / "d.jsonl", 48)
    config = cli_config(["-m", tiny_model_dir, "-d", data, "-ibs", "16", "-imbs", "16", "-g", "4", "-tbs", "8",
                         "-tMbs", "8", "-tmbs", "8", "-mnt", "6", "--learner-chunk-size", "8"], tmp_path)
    learner = LearnerRounds(config)
    assert learner.info() == {"prompts": 16, "skipped_too_long": 0, "rounds_per_episode": 2,  # rows 32..47
                              "engine_precision": "fp32"}
    assert (learner.rounds.stream, learner.rounds.source, learner.rounds.round_size) == (1, "learner", 8)
    batches = [learner.rounds.batch(r) for r in range(2)]
    sources = sorted(int(e.source.rsplit(":", 1)[1]) for b in batches for e, _, _ in b)
    assert sources == list(range(33, 49))  # one episode = the whole learner shard (1-based lines 33-48) once

    policy = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    torch.manual_seed(0)
    with torch.no_grad():
        for param in policy.parameters():
            param.add_(0.05 * torch.randn_like(param))
    learner.load_weights(policy.named_parameters())
    trainer_rng = torch.get_rng_state()
    groups = learner.make(1, version=3)
    assert torch.equal(torch.get_rng_state(), trainer_rng)  # the trainer's own RNG is left as it was
    assert len(groups) == 8 and all(g.learner and g.policy_version == 3 for g in groups)
    assert [g.prompt_ids for g in groups] == [ids for _, _, ids in batches[1]]
    again = learner.make(1, version=3)  # per-round seed: the same round samples the same completions
    assert [g.responses for g in again] == [g.responses for g in groups]
    assert [g.responses for g in learner.make(0, version=3)] != [g.responses for g in groups]

    batch = collate(groups, learner.rounds.backend.pad_id)
    mask = batch["action_mask"].bool()

    def max_gap(model) -> float:
        with torch.no_grad():
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        recomputed = token_logprobs(logits, batch["input_ids"], config.sampling.temperature)
        return float((recomputed - batch["old_logprobs"])[mask].abs().max())

    assert max_gap(policy) <= 1e-5  # on-policy: the behaviour logprobs are the trained weights' own
    disk = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    assert max_gap(disk) > 1e-2  # and they are not the weights the generator started from


def test_a_learner_round_runs_the_runs_environment(tiny_model_dir, tmp_path):
    """--env with --learner-chunk-size: the learner's groups are the environment's episodes (a loss mask per
    response, turns recorded, the environment's reward), as a producer's are."""
    data = write_rows(tmp_path / "d.jsonl", 24)
    config = cli_config(["-m", tiny_model_dir, "-d", data, "-ibs", "8", "-imbs", "8", "-g", "2", "-tbs", "4",
                         "-tMbs", "4", "-tmbs", "8", "-mnt", "6", "-mpt", "512", "--learner-chunk-size", "4",
                         "--env", f"{EXAMPLE}:CalculatorEnv", "--max-turns", "2", "--max-episode-tokens", "24"],
                        tmp_path)
    learner = LearnerRounds(config)
    assert "multiply" in learner.rounds.batch(0)[0][1]  # the environment's tool prompt is in the learner's prompts
    groups = learner.make(0, version=0)
    assert len(groups) == 4 and all(g.learner and len(g.loss_masks) == 2 and g.turns for g in groups)
    assert all(len(m) == len(r) for g in groups for m, r in zip(g.loss_masks, g.responses))


def test_a_learner_round_is_scored_by_the_reward_model(tiny_model_dir, reward_model_dir, tmp_path):
    """-a PPO --reward-model with --learner-chunk-size (refused before: the learner had no reward model): the
    learner's groups carry the model's score of every response, as a producer's do."""
    data = write_rows(tmp_path / "d.jsonl", 24)
    config = cli_config(["-m", tiny_model_dir, "-d", data, "-a", "PPO", "--reward-model", reward_model_dir,
                         "-ibs", "8", "-imbs", "8", "-g", "2", "-tbs", "4", "-tMbs", "4", "-tmbs", "8", "-mnt", "6",
                         "--learner-chunk-size", "4"], tmp_path)
    groups = LearnerRounds(config).make(0, version=0)
    assert len(groups) == 4 and all(g.learner and len(g.scores) == 2 for g in groups)
    assert len({score for g in groups for score in g.scores}) > 1  # the model's scores, not a constant


def demo_run(demo_assets, tmp_path, flags):
    train = head(demo_assets.train_path, tmp_path / "train.jsonl", 64)
    evals = head(demo_assets.eval_path, tmp_path / "eval.jsonl", 8)
    argv = ["-d", train, "-ed", json.dumps({"add": evals}), "-ibs", "8", "-imbs", "8", "-g", "4",
            "-tMbs", "4", "-tmbs", "8", "-e", "1", "-sd", str(tmp_path / "runs"), "--no-progress",
            "--learner-chunk-size", "8", *flags]
    result, rows = run_cli(argv, demo_assets)
    return result, [r for r in rows if r["kind"] in ("train", "skipped")]


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_dapo_with_two_trainers_draws_every_group_once(demo_assets, tmp_path):
    """-t 2 (dp 2, tbs 4): only the weight sender generates, so the run draws exactly 4 rounds x (8 + 8)
    groups, 32 of them the learner's, whatever DAPO's filter and dynamic batching keep."""
    result, rows = demo_run(demo_assets, tmp_path, ["-a", "DAPO", "-t", "2", "-tbs", "4"])
    assert sum(r["groups_drawn"] for r in rows) == 64
    assert sum(r["learner_groups"] for r in rows) == 32
    # A step that needs more groups than its round still holds publishes mid-step (the unchanged weights) and
    # then draws the next round, so it reports a lag of 1; nothing is ever older than that.
    assert all(r["policy_lag"] <= 1 for r in rows)
    assert rows[-1]["weight_version"] == 4
    assert result.steps == sum(r["kind"] == "train" for r in rows) >= 1
