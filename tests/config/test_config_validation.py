"""Every impossible setting or bad input stops the CLI with one clear line (exit 2) before any work."""

import json
import os
import subprocess
import sys

import pytest

import rl_example
from coati.config.data import parse_eval_datasets
from coati.config.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_cli(argv, capsys):
    code = rl_example.main(argv)
    err = capsys.readouterr().err.strip()
    return code, err


@pytest.mark.parametrize("argv, message", [
    # batch sizes given together that clash (one alone: the others follow it, tests/config/test_batch_defaults.py)
    (["-t", "3", "-ibs", "64"], "num_inferencer*ibs (64) must be a multiple of data-parallel trainers*tbs (96)"),
    (["-ibs", "64", "-tbs", "48", "-tMbs", "16"],
     "num_inferencer*ibs (64) must be a multiple of data-parallel trainers*tbs (48)"),
    (["-tbs", "16", "-tMbs", "32"], "-tbs (16) must be >= -tMbs (32)"),
    (["-tbs", "32", "-tMbs", "12"], "-tbs (32) must be a multiple of -tMbs (12)"),
    (["-tbs", "4", "-tMbs", "4", "-g", "2", "-tmbs", "16"], "-tMbs*g (8 samples) must be >= -tmbs (16)"),
    (["-ibs", "64", "-imbs", "128"], "-ibs (64) must be >= -imbs (128)"),
    (["-g", "1"], "must be at least 2"),
    (["-nb", "-1"], "-nb/--max-staleness must be >= 0 (0: sync mode), got -1"),
    (["--keep-checkpoints", "-1"], "--keep-checkpoints must be >= 0 (0 keeps all), got -1"),
    (["--max-staleness", "1", "--tis-cap", "0.5"], "--tis-cap must be >= 1"),
    (["-nb", "1", "--learner-chunk-size", "32", "-ibs", "32", "-imbs", "32"],
     "--learner-chunk-size needs -nb/--max-staleness 0"),
    (["-temp", "0"], "temperature must be > 0"),
    (["-topp", "1.5"], "--top-p must lie in (0, 1]"),
    (["-e", "0"], "-e/--num-episodes must be at least 1"),
    (["-lr", "0"], "-lr/--learning-rate must be > 0"),
    (["-ed", "{bad json"], "--eval-dataset is not valid JSON"),
    (["-ed", '{"t": "/nonexistent/eval.jsonl"}'], "-ed/--eval-dataset file for task 't' not found"),
    (["-ed", '{"../x": "a.jsonl"}'], "is not a valid file name"),
    (["-rt", "think_answer_tags"], "embedded demo model answers in \\boxed{}"),
    # Trainer layouts: against the trainer count, the plugin family, the precision and the model.
    (["-t", "2", "-tp", "2", "-pp", "2"], "num_trainers (2) must be a multiple of tp*pp (4)"),
    (["-t", "4", "-tp", "2", "-pp", "2", "-tbs", "16", "-tMbs", "16"], "-tp and -pp together need --plugin colossalai"),
    (["-t", "2", "-pp", "2", "-zero", "1"], "-zero with -pp needs --plugin colossalai"),
    (["-t", "2", "--precision", "fp16"], "torch-ddp trains in fp32 or bf16 (fp16 needs a loss scaler"),
    (["--precision", "fp16"], "single trains in fp32 or bf16"),
    # The optimizer knobs (--grpo-config's keys too).
    (["--weight-decay", "-0.1"], "--weight-decay must be >= 0"),
    (["--lr-warmup-ratio", "1.5"], "--lr-warmup-ratio must lie in [0, 1)"),
    (["--lr-warmup-steps", "-1"], "--lr-warmup-steps must be >= 0"),
    (["--max-steps", "-2"], "--max-steps must be >= 0"),
    (["--grpo-config", '{"lr_scheduler": "step"}'], "--lr-scheduler must be one of constant, linear, cosine"),
    (["-t", "2", "-tp", "2", "--plugin", "colossalai", "--gradient-checkpointing"],
     "--gradient-checkpointing is not available with colossalai-hybrid"),
    (["-t", "2", "-tp", "2", "-zero", "1", "--plugin", "colossalai"], "refuses ZeRO in fp32"),
    (["-t", "2", "-pp", "2", "-zero", "2", "--plugin", "colossalai", "--precision", "bf16"],
     "pipeline parallelism supports zero stage 0 or 1 only"),
    (["-zero", "4"], "-zero/--zero-stage must be 0, 1, 2 or 3"),
    (["-t", "2", "-pp", "2", "--packing", "on"], "--packing on: the torch-pp plugin cannot pack samples"),
    (["-t", "2", "--shared-prompts", "on"], "--shared-prompts on: the torch-ddp plugin cannot run a group's prompt"),
    (["--shared-prompts", "on", "--gradient-checkpointing"],
     "--shared-prompts on: the single plugin with --gradient-checkpointing cannot"),
    (["-t", "3", "-tp", "3"], "tp_size 3 does not divide the model's 4 attention heads"),  # the demo model's
    (["-t", "3", "-pp", "3"], "pp_size 3 does not divide the model's 2 decoder layers"),
])
def test_bad_flags_give_one_line(argv, message, capsys):
    code, err = run_cli(argv, capsys)
    assert code == 2
    assert err.count("\n") == 0 and err.startswith("error: "), err
    assert message in err


@pytest.mark.parametrize("argv, message", [
    (["-rt", "code", "--code-cpu-seconds", "0"], "cpu_time_s must be at least 1"),
    (["-rt", "code", "--code-memory-mb", "0"], "address_space_bytes must be positive"),
    (["-rt", "code", "--code-max-processes", "2"], "max_processes must be at least 4"),
    (["-rt", "code", "--code-workers", "0"], "--code-workers must be at least 1"),
])
def test_bad_code_sandbox_flags(argv, message, capsys):
    code, err = run_cli(argv, capsys)
    assert code == 2 and err.startswith("error: ") and message in err, err


def test_code_flags_reach_the_scorer_options():
    from coati.config.cli import build_parser, config_from_args
    from coati.demo.assets import DemoAssets

    demo = DemoAssets("m", "t", "e", {})
    args = build_parser().parse_args(["-rt", "code", "--code-all-or-nothing", "--code-memory-mb", "2048",
                                      "--code-cpu-seconds", "3", "--code-workers", "2"])
    config = config_from_args(args, demo)
    assert (config.model.path, config.data.train_path, config.data.eval_paths) == ("m", "t", {"code": "e"})
    options = config.data.code.scorer_options()
    assert options["all_or_nothing"] and options["max_workers"] == 2
    assert options["limits"].address_space_bytes == 2048 << 20 and options["limits"].cpu_time_s == 3


def test_unknown_reward_type_is_rejected_by_the_parser(capsys):
    with pytest.raises(SystemExit) as exit_info:
        rl_example.main(["-rt", "regex"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'regex'" in capsys.readouterr().err


def write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def good_rows(n):
    return [{"messages": {"role": "user", "content": f"{i}+1="}, "gt_answer": str(i + 1)} for i in range(n)]


def test_missing_model_dir(tmp_path, capsys):
    data = write_rows(tmp_path / "d.jsonl", good_rows(64))
    code, err = run_cli(["-m", str(tmp_path / "nope"), "-d", data], capsys)
    assert code == 2 and "model directory not found" in err


def test_model_dir_without_config(tmp_path, capsys):
    data = write_rows(tmp_path / "d.jsonl", good_rows(64))
    code, err = run_cli(["-m", str(tmp_path), "-d", data], capsys)
    assert code == 2 and "has no config.json" in err


def test_dataset_missing_malformed_or_too_small(tiny_model_dir, tmp_path, capsys):
    code, err = run_cli(["-m", tiny_model_dir], capsys)
    assert code == 2 and "-d/--dataset is required" in err
    code, err = run_cli(["-m", tiny_model_dir, "-d", str(tmp_path / "missing.jsonl")], capsys)
    assert code == 2 and "dataset file not found" in err
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(good_rows(1)[0]) + "\n" + '{"messages": "oops"}\n')
    code, err = run_cli(["-m", tiny_model_dir, "-d", str(bad)], capsys)
    assert code == 2 and f"{bad}:2:" in err
    small = write_rows(tmp_path / "small.jsonl", good_rows(10))
    code, err = run_cli(["-m", tiny_model_dir, "-d", small], capsys)
    assert code == 2 and "has 10 prompts" in err and "-ibs=64" in err
    good = write_rows(tmp_path / "good.jsonl", good_rows(64))
    code, err = run_cli(["-m", tiny_model_dir, "-d", good, "-ed", json.dumps({"t": str(bad)})], capsys)
    assert code == 2 and f"{bad}:2:" in err


def test_parse_eval_datasets(tmp_path):
    a, b = write_rows(tmp_path / "a.jsonl", good_rows(2)), write_rows(tmp_path / "b.jsonl", good_rows(2))
    assert parse_eval_datasets(json.dumps({"gsm8k": a, "math-500": b})) == {"gsm8k": a, "math-500": b}
    assert parse_eval_datasets(None) == {}
    with pytest.raises(ConfigError, match="JSON object"):
        parse_eval_datasets('["a.jsonl"]')


@pytest.mark.parametrize("text, message", [
    ('{"math": "A.jsonl"', "-ed/--eval-dataset is not valid JSON (Expecting ',' delimiter at column "),
    ("{}", "must be a non-empty JSON object"),
    ('{"math": "A.jsonl", "math": "A.jsonl"}', "names task 'math' twice"),
    ('{"a/b": "A.jsonl"}', "task name 'a/b' is not a valid file name"),
    ('{"..": "A.jsonl"}', "task name '..' is not a valid file name"),
    ('{"my task": "A.jsonl"}', "task name 'my task' is not a valid file name"),
    ('{"math": 3}', "path for task 'math' must be a non-empty string"),
    ('{"math": "MISSING"}', "-ed/--eval-dataset file for task 'math' not found: "),
])
def test_bad_eval_datasets_give_one_line(text, message, tmp_path, capsys):
    good = write_rows(tmp_path / "good.jsonl", good_rows(2))
    text = text.replace("A.jsonl", good).replace("MISSING", str(tmp_path / "missing.jsonl"))
    code, err = run_cli(["-ed", text], capsys)  # the embedded demo: rejected before any asset is built
    assert code == 2 and err.count("\n") == 0 and err.startswith("error: "), err
    assert message in err


def test_eval_interval_and_rollout_flags(tiny_model_dir, tmp_path, capsys):
    data = write_rows(tmp_path / "d.jsonl", good_rows(64))
    code, err = run_cli(["-m", tiny_model_dir, "-d", data, "-ei", "2"], capsys)
    assert code == 2 and "-ei/--eval-interval needs held-out data: pass -ed/--eval-dataset" in err
    code, err = run_cli(["-ei", "-1"], capsys)
    assert code == 2 and "-ei/--eval-interval must be >= 0" in err
    code, err = run_cli(["-rsd", str(tmp_path), "--rollout-save-interval", "0"], capsys)
    assert code == 2 and "--rollout-save-interval must be at least 1, got 0" in err


def test_real_cli_prints_no_traceback():
    proc = subprocess.run([sys.executable, "rl_example.py", "-tbs", "16", "-tMbs", "32"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == ["error: -tbs (16) must be >= -tMbs (32)"]


def test_code_demo_defaults_and_what_overrides_them():
    """-rt code without a model takes the code demo's flags; a user's model or explicit flags do not."""
    from coati.config.cli import build_parser, config_from_args
    from coati.demo.assets import DemoAssets

    demo = DemoAssets("m", "t", "e", {})

    def config(*argv):
        return config_from_args(build_parser().parse_args(list(argv)), demo)

    code = config("-rt", "code")
    assert (code.batch.inference_batch_size, code.batch.train_batch_size, code.batch.train_microbatch_size) == (16, 8, 64)
    assert (code.algo.ppo_epochs, code.run.num_episodes, code.sampling.max_new_tokens) == (4, 2, 16)
    addition = config()
    assert (addition.batch.inference_batch_size, addition.batch.train_batch_size, addition.algo.ppo_epochs) == (64, 32, 1)
    user = config("-rt", "code", "-m", "model_dir", "-d", "rows.jsonl")
    assert (user.batch.inference_batch_size, user.batch.train_batch_size, user.algo.ppo_epochs) == (64, 32, 1)
    assert config("-rt", "code", "--ppo-epochs", "2", "-tbs", "16", "-tMbs", "16").algo.ppo_epochs == 2
    assert config("-rt", "code", "--grpo-config", '{"ppo_epochs": 1}').algo.ppo_epochs == 1
