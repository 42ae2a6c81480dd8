"""``coati evaluate`` on the demo model: its numbers equal a direct computation (generation with the same
backend and seed, the training reward, one unpadded reward-model forward per row); rows without answers get
reward-model scores only; every bad input is one error line before any model is loaded."""

from __future__ import annotations

import json
import os
import shutil
import statistics

import pytest
import torch

from coati.rlhf.evaluate import main


@pytest.fixture(scope="module")
def reward_model_dir(demo_assets, tmp_path_factory):
    """The demo model's body with a seeded random head (what matters here is that scores are computed right)."""
    from transformers import AutoTokenizer

    from coati.trainer.stage_tasks import RewardTask

    torch.manual_seed(0)
    path = str(tmp_path_factory.mktemp("rm"))
    RewardTask.load_model(demo_assets.model_dir).save_pretrained(path)
    AutoTokenizer.from_pretrained(demo_assets.model_dir).save_pretrained(path)
    return path


def write_rows(path, rows):
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return str(path)


def math_rows(demo_assets, count):
    with open(demo_assets.eval_path) as handle:
        return [json.loads(line) for line in handle][:count]


def direct(model_dir, prompts, mode, reward_model_dir, max_new_tokens):
    """(texts, token ids, scores) computed without coati.rlhf: generate, then one forward per row."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    from coati.config.sampling import SamplingParams
    from coati.rollout.inference_backend import TransformersBackend

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    backend = TransformersBackend(AutoModelForCausalLM.from_pretrained(model_dir), tokenizer, 32)
    prompt_ids = [tokenizer(p, add_special_tokens=False).input_ids for p in prompts]
    params = SamplingParams(temperature=0.0 if mode == "greedy" else 1.0, max_new_tokens=max_new_tokens,
                            seed=None if mode == "greedy" else 42)
    completions = [c[0] for c in backend.generate(prompt_ids, params)]
    rm = AutoModelForSequenceClassification.from_pretrained(reward_model_dir).eval()
    scores = []
    for p, c in zip(prompt_ids, completions):
        row = p + c.token_ids + ([] if c.token_ids[-1:] == [tokenizer.eos_token_id] else [tokenizer.eos_token_id])
        with torch.no_grad():
            scores.append(rm(input_ids=torch.tensor([row])).logits[0, 0].item())
    return [c.text for c in completions], scores


def test_math_rows_with_a_reward_model_match_a_direct_computation(demo_assets, reward_model_dir, tmp_path, capsys):
    from coati.dataset.rows import Example
    from rewards.scorer import RewardScorer

    rows = math_rows(demo_assets, 12)
    path = write_rows(tmp_path / "eval.jsonl", rows)
    output = str(tmp_path / "out" / "summary.json")
    assert main(["-m", demo_assets.model_dir, "-d", path, "-rm", reward_model_dir, "-mnt", "8", "-o", output]) == 0
    printed = capsys.readouterr().out
    summary = json.load(open(output))
    records = [json.loads(line) for line in open(tmp_path / "out" / "summary.samples.jsonl")]
    assert summary["samples"] == str(tmp_path / "out" / "summary.samples.jsonl") and len(records) == 24
    scorer = RewardScorer("boxed")
    for mode in ("greedy", "sampled"):
        texts, scores = direct(demo_assets.model_dir, [r["messages"]["content"] for r in rows], mode,
                               reward_model_dir, 8)
        mine = [r for r in records if r["mode"] == mode]
        assert [r["response"] for r in mine] == texts
        assert [r["rm_score"] for r in mine] == pytest.approx(scores, abs=1e-5)
        results = [scorer.score([text], Example(({"role": "user", "content": "x"},), r["gt_answer"]))[0]
                   for text, r in zip(texts, rows)]
        metrics = summary["modes"][mode]
        assert metrics["accuracy"] == sum(r.correct for r in results) / 12
        assert metrics["format_rate"] == sum(r.format_ok for r in results) / 12
        assert metrics["mean_reward"] == pytest.approx(sum(r.reward for r in results) / 12)
        assert metrics["rm_score_mean"] == pytest.approx(statistics.fmean(scores), abs=1e-6)
        assert metrics["rm_score_std"] == pytest.approx(statistics.pstdev(scores), abs=1e-6)
        assert (metrics["prompts"], metrics["answered"]) == (12, 12)
        assert f"{mode:<8}{12:>10}{metrics['accuracy']:>10.4f}" in printed
    assert 0 < summary["modes"]["greedy"]["accuracy"] < 1  # the warm-started demo model is partly right
    assert "rm_score" in printed and f"summary: {output}" in printed


def test_prompt_rows_without_answers_get_reward_model_scores_only(demo_assets, reward_model_dir, tmp_path, capsys):
    checkpoint = shutil.copytree(demo_assets.model_dir, tmp_path / "run" / "step_3")  # a GRPO run's step_N
    prompts = [row["messages"]["content"] for row in math_rows(demo_assets, 6)]
    path = write_rows(tmp_path / "prompts.jsonl", [{"prompt": p} for p in prompts])
    assert main(["-m", str(checkpoint), "-d", path, "--reward-model", reward_model_dir, "--modes", "greedy",
                 "-mnt", "8"]) == 0
    printed = capsys.readouterr().out
    output = tmp_path / "run" / "evals" / "step_3_prompts.json"  # the default: beside the checkpoint
    summary = json.load(open(output))
    metrics = summary["modes"]["greedy"]
    assert list(summary["modes"]) == ["greedy"] and metrics["answered"] == 0
    assert metrics["accuracy"] is None and metrics["mean_reward"] is None
    texts, scores = direct(str(checkpoint), prompts, "greedy", reward_model_dir, 8)
    records = [json.loads(line) for line in open(tmp_path / "run" / "evals" / "step_3_prompts.samples.jsonl")]
    assert [r["response"] for r in records] == texts and all(r["reward"] is None for r in records)
    assert [r["rm_score"] for r in records] == pytest.approx(scores, abs=1e-5)
    assert "no answers in the rows: accuracy, format and reward (-rt boxed) skipped" in printed
    assert "accuracy" not in printed.splitlines()[1]  # no accuracy column


def test_mixed_rows_score_the_answered_ones(demo_assets, tmp_path, capsys):
    rows = math_rows(demo_assets, 4)
    path = write_rows(tmp_path / "mixed.jsonl", rows[:3] + [{"prompt": rows[3]["messages"]["content"]}])
    assert main(["-m", demo_assets.model_dir, "-d", path, "--modes", "greedy", "-mnt", "8",
                 "-o", str(tmp_path / "s.json")]) == 0
    printed = capsys.readouterr().out
    metrics = json.load(open(tmp_path / "s.json"))["modes"]["greedy"]
    assert (metrics["prompts"], metrics["answered"], metrics["rm_score_mean"]) == (4, 3, None)
    assert "over the 3 of 4 prompts with answers" in printed and "no --reward-model" in printed


@pytest.fixture
def no_model_loads(monkeypatch):
    import transformers

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the inputs were checked")

    for name in ("AutoModelForCausalLM", "AutoModelForSequenceClassification"):
        monkeypatch.setattr(getattr(transformers, name), "from_pretrained", refuse)


def test_bad_inputs_are_one_error_line_before_any_model(demo_assets, reward_model_dir, tmp_path, capsys,
                                                        no_model_loads):
    model = demo_assets.model_dir
    good = write_rows(tmp_path / "good.jsonl", math_rows(demo_assets, 2))
    bad = write_rows(tmp_path / "bad.jsonl", [{"prompt": "1+1="}, {"question": "2+2="}])
    no_tokenizer = shutil.copytree(model, tmp_path / "bare", ignore=shutil.ignore_patterns("tokenizer*"))
    options = tmp_path / "eval.yaml"
    options.write_text("max_new_tokens: 8\nlearning_rate: 1e-4\n")
    cases = [
        (["-m", str(tmp_path / "nope"), "-d", good], "model directory not found or without config.json"),
        (["-m", model, "-d", str(tmp_path / "nope.jsonl")], "dataset file not found"),
        (["-m", model, "-d", good, "-rm", model], "has no score head (architectures ['Qwen2ForCausalLM']"),
        (["-m", model, "-d", good, "-rm", str(tmp_path / "nope")], "reward model directory not found"),
        (["-m", reward_model_dir, "-d", good], "is a reward model (Qwen2ForSequenceClassification), not a causal LM"),
        (["-m", str(no_tokenizer), "-d", good], "has no tokenizer files"),
        (["-m", model], "-d/--dataset is required with -m/--model"),
        (["-m", model, "-d", bad], f'{bad}:2: missing "messages" or "prompt"'),
        (["-m", model, "-d", good, "--label-key", "answer"], f'{good}:1: missing "answer"'),
        (["-m", model, "-d", good, "-mnt", "0"], "-mnt/--max-new-tokens must be at least 1"),
        (["-m", model, "-d", good, "-mpt", "2"], "all 2 prompts are longer than -mpt 2 tokens"),
        (["-m", model, "-d", good, "--config", str(options)], f"--config {options} has unknown key 'learning_rate'"),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and message in err, (argv, err)


def test_a_reward_model_without_head_weights_stops_before_the_policy_loads(demo_assets, tmp_path, capsys, monkeypatch):
    import transformers

    relabelled = shutil.copytree(demo_assets.model_dir, tmp_path / "relabelled")
    config = json.load(open(relabelled / "config.json"))
    config.update(architectures=["Qwen2ForSequenceClassification"], id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0})
    json.dump(config, open(relabelled / "config.json", "w"))

    def refuse(*args, **kwargs):
        raise AssertionError("the policy was loaded")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    good = write_rows(tmp_path / "good.jsonl", math_rows(demo_assets, 2))
    assert main(["-m", demo_assets.model_dir, "-d", good, "-rm", str(relabelled)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "weights missing from the checkpoint" in err, err
    assert not os.path.exists(tmp_path / "evals")


BOXED_ANYTHING = '''
def says_boxed(response, label, row):
    """Correct when the response boxes anything: the built-in boxed reward would also check the answer."""
    ok = "\\\\boxed{" in response
    return float(ok), {"correct": ok}
'''


def test_a_runs_checkpoint_is_scored_with_the_runs_own_reward(demo_assets, tmp_path, capsys):
    """A checkpoint of a run trained with --reward-fn (its step_N: the model and the run's saved options) is
    evaluated with that reward by default, and says so; a reward option given here replaces the run's."""
    reward = tmp_path / "my_reward.py"
    reward.write_text(BOXED_ANYTHING)
    checkpoint = tmp_path / "run" / "step_4"
    shutil.copytree(demo_assets.model_dir, checkpoint)
    options = {"reward_type": "boxed", "reward_fn": [f"{reward}:says_boxed"], "reward_weights": "boxed:0",
               "learning_rate": 3e-4}
    (checkpoint / "run_state.json").write_text(json.dumps({"step": 4, "options": options}))
    data = write_rows(tmp_path / "eval.jsonl", math_rows(demo_assets, 16))
    argv = ["-m", str(checkpoint), "-d", data, "--modes", "greedy", "-mnt", "8"]

    assert main(argv + ["-o", str(tmp_path / "own.json")]) == 0
    printed = capsys.readouterr().out
    records = [json.loads(line) for line in open(tmp_path / "own.samples.jsonl")]
    boxed = statistics.fmean("\\boxed{" in r["response"] for r in records)
    own = json.load(open(tmp_path / "own.json"))
    assert own["modes"]["greedy"]["accuracy"] == pytest.approx(boxed)
    assert own["reward_fn"] == [f"{reward}:says_boxed"] and own["reward_weights"] == "boxed:0"
    assert (f"reward: -rt boxed x0 + {reward}:says_boxed (the run's own, from {checkpoint / 'run_state.json'}; a "
            "reward option given here replaces it)") in printed.splitlines()

    # the built-in reward, asked for by a flag: the answers are checked, not only boxed
    assert main(argv + ["-rt", "boxed", "-o", str(tmp_path / "builtin.json")]) == 0
    printed = capsys.readouterr().out
    builtin = json.load(open(tmp_path / "builtin.json"))
    records = [json.loads(line) for line in open(tmp_path / "builtin.samples.jsonl")]
    right = statistics.fmean(r["extracted"] == r["gt_answer"] for r in records)
    assert builtin["modes"]["greedy"]["accuracy"] == pytest.approx(right)
    assert right < own["modes"]["greedy"]["accuracy"]  # the demo model boxes every answer, right or not
    assert builtin["reward_fn"] == [] and builtin["reward_weights"] is None
    assert (f"reward: -rt boxed (given here, instead of the run's own in {checkpoint / 'run_state.json'})"
            in printed.splitlines())


def test_evaluate_takes_trains_reward_options_and_their_checks(demo_assets, tmp_path, capsys, no_model_loads):
    data = write_rows(tmp_path / "eval.jsonl", math_rows(demo_assets, 2))
    assert main(["-m", demo_assets.model_dir, "-d", data, "--reward-weights", "boxed:x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "boxed:x" in err and len(err.splitlines()) == 1
    assert main(["-m", demo_assets.model_dir, "-d", data, "--correct-threshold", "nan"]) == 2
    assert capsys.readouterr().err == "error: --correct-threshold must be a finite number, got nan\n"


def test_a_runs_checkpoint_is_evaluated_with_its_prompt_template_and_stops(demo_assets, tmp_path, capsys):
    """A base model's run (--prompt-template, --stop) is evaluated on the prompts it trained on, and its responses
    end at the stop as a natural end; a template given here replaces the run's."""
    checkpoint = tmp_path / "run" / "step_2"
    shutil.copytree(demo_assets.model_dir, checkpoint)
    options = {"reward_type": "boxed", "prompt_template": "Q{prompt}", "stop": ["}"]}
    (checkpoint / "run_state.json").write_text(json.dumps({"step": 2, "options": options}))
    data = write_rows(tmp_path / "eval.jsonl", math_rows(demo_assets, 8))
    argv = ["-m", str(checkpoint), "-d", data, "--modes", "greedy", "-mnt", "8"]
    assert main(argv + ["-o", str(tmp_path / "own.json")]) == 0
    capsys.readouterr()
    records = [json.loads(line) for line in open(tmp_path / "own.samples.jsonl")]
    assert all(r["prompt"].startswith("Q") and not r["prompt"].startswith("QQ") for r in records)
    ended = [r for r in records if "}" in r["response"]]
    assert ended and all(r["response"].endswith("}") and r["finish_reason"] == "stop" for r in ended)
    assert main(argv + ["--prompt-template", "{prompt}", "-o", str(tmp_path / "given.json")]) == 0
    assert not any(json.loads(line)["prompt"].startswith("Q") for line in open(tmp_path / "given.samples.jsonl"))


def test_evaluate_checks_the_prompt_options_as_train_does(demo_assets, tmp_path, capsys, no_model_loads):
    data = write_rows(tmp_path / "eval.jsonl", math_rows(demo_assets, 2))
    assert main(["-m", demo_assets.model_dir, "-d", data, "--prompt-template", "Q: {question}"]) == 2
    assert "--prompt-template 'Q: {question}' has no {prompt}" in capsys.readouterr().err
    assert main(["-m", demo_assets.model_dir, "-d", data, "--stop", ""]) == 2
    assert capsys.readouterr().err == "error: --stop needs a text to stop at, got an empty string\n"
