"""The developer tools' input checks: a bad value is refused in one line, before any work starts."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.run_helpers import ROOT


@pytest.mark.parametrize("stages", ["9", "1 x", "1+1", "0"])
def test_gpu_check_refuses_an_unknown_stage_before_probing_the_gpu(stages):
    # PY=false: any probe of the interpreter would fail differently, so the refusal must come first
    result = subprocess.run(["bash", "scripts/gpu_check.sh", "/nonexistent/out"], cwd=ROOT, capture_output=True,
                            text=True, timeout=30, env={"PATH": "/usr/bin:/bin", "PY": "false", "STAGES": stages})
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"gpu_check: no stage {stages.split()[-1]} in STAGES (stages: 1 2 3 4 5)"]


@pytest.mark.parametrize("value", ["0", "-0.5", "1.5"])
def test_bench_trainer_memory_refuses_a_slice_outside_the_logits(value):
    result = subprocess.run([sys.executable, "benchmarks/bench_trainer_memory.py", "--entropy-slice", value],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].endswith(
        f"--entropy-slice {float(value):g}: a fraction of the logits, in (0, 1]")


@pytest.mark.parametrize("prompts", ["50", "32"])
def test_soak_refuses_a_prompt_count_of_no_whole_quarters(prompts):
    result = subprocess.run([sys.executable, "benchmarks/soak.py", "--prompts", prompts], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].endswith(
        "--prompts must be a multiple of 32, at least 64 (four quarters of whole rounds)")


def _benchmark(name: str):
    """benchmarks/NAME.py as a module (the directory is no package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, f"{ROOT}/benchmarks/{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_record_baseline_reads_the_summary_and_appends_below_the_last_row(tmp_path):
    record = _benchmark("record_baseline")
    printed = ("eval step 12 arithmetic/sampled: accuracy 0.812\n"
               "trained 12 steps in 301 s; final model: runs/demo-smollm2/step_12\n"
               "held-out accuracy arithmetic/sampled: 0.240 -> 0.812 (+57.2 points)\n"
               "held-out accuracy arithmetic/greedy: 0.302 -> 0.906 (+60.4 points)\n")
    steps, results = record.parse_summary(printed)
    assert (steps, results) == (12, ["arithmetic/sampled: 0.240 -> 0.812", "arithmetic/greedy: 0.302 -> 0.906"])
    with pytest.raises(ValueError, match="printed no summary"):
        record.parse_summary("trained 12 steps in 301 s\n")
    doc = tmp_path / "results.md"
    doc.write_text(f"# R\n\n{record.TABLE_HEADER}\n|---|\n| old |\n\n## Next\n")
    record.append_row("| new |", str(doc))
    assert doc.read_text() == f"# R\n\n{record.TABLE_HEADER}\n|---|\n| old |\n| new |\n\n## Next\n"
    line = record.row("smollm2", steps, 5.04, results)
    assert line.endswith("| smollm2 | 12 | 5.0 | arithmetic/sampled: 0.240 -> 0.812; arithmetic/greedy: 0.302 -> 0.906 |")


def test_the_peer_benchmarks_user_run_names_the_task_and_no_batch_or_layout_flag(tmp_path):
    """benchmarks/peer_trl.py --run user: the flags parse as a user's run, and every micro-batch, layout, engine
    and thread choice is left to the defaults (what the issue's "no batch flags" run measures)."""
    from coati.config.cli import build_parser

    module = _benchmark("peer_trl")
    parser = build_parser()
    args = parser.parse_args(module.user_run_flags(str(tmp_path / "model.gguf"), str(tmp_path / "rows.jsonl")))
    assert parser.given == {"model", "dataset", "reward_fn", "reward_weights", "system_prompt", "num_generations",
                            "train_batch_size", "inference_batch_size", "max_new_tokens", "learning_rate", "project"}
    assert (args.num_generations, args.train_batch_size, args.max_new_tokens) == (8, 8, 32)


def _embedded_demo_config(*flags):
    from coati.config.cli import build_parser, config_from_args
    from coati.train import placeholder_demo

    parser = build_parser()
    return config_from_args(parser.parse_args(list(flags)), placeholder_demo(), given=parser.given)


def test_the_peer_benchmarks_addition_task_gives_trl_the_embedded_demos_settings():
    """benchmarks/peer_trl.py --task addition: every GRPOConfig setting is the embedded demo's, as coati's parser
    builds its config with no arguments and its trainer's AdamW gets them (no copy of a number here)."""
    import inspect

    from coati.config.errors import ConfigError
    from coati.plugins.base import TrainerPlugin
    from coati.train import placeholder_demo

    module = _benchmark("peer_trl")
    config = _embedded_demo_config()
    trl = module.trl_settings(module.demo_config(placeholder_demo()))
    batch, algo, sampling = config.batch, config.algo, config.sampling
    assert trl["num_generations"] == batch.num_generations
    # a TRL step is one optimizer step's samples, a TRL generation one round's
    assert trl["per_device_train_batch_size"] * trl["gradient_accumulation_steps"] == \
        batch.train_batch_size * batch.num_generations
    assert trl["per_device_train_batch_size"] * trl["steps_per_generation"] == \
        batch.inference_batch_size * batch.num_generations
    assert trl["num_iterations"] == algo.ppo_epochs
    assert (trl["max_completion_length"], trl["temperature"], trl["top_p"]) == \
        (sampling.max_new_tokens, sampling.temperature, sampling.top_p)
    assert (sampling.top_k, trl["top_k"]) == (-1, 0)  # each side's "no top-k"
    betas = inspect.signature(TrainerPlugin.setup).parameters["betas"].default
    assert (trl["learning_rate"], trl["adam_beta1"], trl["adam_beta2"], trl["weight_decay"]) == \
        (algo.learning_rate, *betas, algo.optim.weight_decay)
    assert (trl["lr_scheduler_type"], trl["warmup_steps"]) == (algo.optim.lr_scheduler, algo.optim.lr_warmup_steps)
    assert (trl["max_grad_norm"], trl["beta"], trl["epsilon"], trl["epsilon_high"]) == \
        (algo.max_grad_norm, algo.loss.kl_loss_coef, algo.loss.clip_eps_low, algo.loss.clip_eps_high)
    # the same formula under the two names: token mean per sample then mean over samples; (r - mean) / std
    assert (algo.loss.loss_variation, trl["loss_type"]) in {("sample_level", "grpo"), ("token_level", "bnpo")}
    assert (algo.groups.advantage, trl["scale_rewards"]) == ("group_norm", "group")
    assert trl["gradient_checkpointing"] == algo.optim.gradient_checkpointing
    # a setting with no TRL twin is refused, not dropped
    with pytest.raises(ConfigError, match="maps onto TRL only the clipped ratio against the sampling policy"):
        module.trl_settings(_embedded_demo_config("--off-policy-correction", "decoupled"))
