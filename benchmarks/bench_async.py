"""Async rollouts on the demo: sync (S=0) against -nb 1 and -nb 2 (each off-policy correction), same rollouts.

Every run trains the embedded demo for the same episodes (the same prompts in the same order, the same number
of rollouts) and saves a checkpoint every ``--save-every`` steps. After all runs, each checkpoint is evaluated
offline (held-out, sampled at T=1 with one fixed seed, one process, nothing else running), so the accuracy
curve costs the runs nothing. Printed side by side: trainer steps per second (steady state: first to last
step), wall time from the first step to held-out sampled accuracy ``--target``, each as a ratio to S=0, the
final held-out accuracy, staleness and logprob mismatch, and the mean seconds per step of every stage
(trainer: buffer wait, train, publish; producer: generate, score of the groups a step trained on).

    python benchmarks/bench_async.py                # S = 0, 1, 2 with both corrections; 3 episodes (192 steps)
    python benchmarks/bench_async.py --runs 0 1:behaviour --episodes 1   # quicker

A run is ``S`` (the default correction for S) or ``S:correction`` (``--off-policy-correction``).

The load average (``uptime``) is printed before and after: on a shared machine it bounds what the ratios mean.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

STAGES = ("buffer_wait_s", "train_s", "publish_s", "generate_s", "score_s", "step_time_s")


def load() -> str:
    return "load average " + ", ".join(f"{value:.2f}" for value in os.getloadavg())


def train(label: str, episodes: int, save_every: int, out_dir: str, demo) -> dict:
    import ray

    from coati.config.cli import build_parser, config_from_args
    from coati.launcher.preflight import check_inputs
    from coati.launcher.rl import run

    staleness, _, correction = label.partition(":")
    project = f"nb{staleness}" + (f"_{correction}" if correction else "")
    argv = ["-nb", staleness, "-e", str(episodes), "-si", str(save_every), "-sd", out_dir, "-p", project, "--no-progress"]
    if correction:
        argv += ["--off-policy-correction", correction]
    config = config_from_args(build_parser().parse_args(argv), demo)
    check_inputs(config)
    try:
        result = run(config, log=lambda message: None)
    finally:
        ray.shutdown()
    rows = [json.loads(line) for line in open(result.metrics_path)]
    return {"result": result, "train": [r for r in rows if r["kind"] == "train"], "config": config,
            "run_dir": os.path.join(out_dir, project)}


def evaluate_checkpoints(run_dir: str, config, seed: int) -> dict[int, float]:
    """Held-out sampled (T=1) accuracy of every step_N of ``run_dir``, one fixed sampling seed for all."""
    import dataclasses

    from coati.dataset.jsonl import load_jsonl
    from coati.rollout.evaluation import evaluate
    from coati.rollout.generation import tokenise_prompts
    from coati.rollout.inference_backend import TransformersBackend
    from coati.utils.checkpoint import list_checkpoints
    from rewards.scorer import RewardScorer

    (_, eval_path), = config.data.eval_paths.items()
    params = dataclasses.replace(dict(config.eval_sampling)["sampled"], seed=seed)
    scorer = RewardScorer(config.data.reward_type)
    accuracy = {}
    for step, path in list_checkpoints(run_dir):
        backend = TransformersBackend.from_pretrained(path, config.batch.inference_microbatch_size)
        examples, _ = tokenise_prompts(backend.tokenizer, load_jsonl(eval_path, config.data.reward_type),
                                       config.data.system_prompt, config.data.max_prompt_tokens)
        accuracy[step] = evaluate(backend, [ids for _, _, ids in examples], [e for e, _, _ in examples], scorer,
                                  params).accuracy
    return accuracy


def summarise(label: str, run: dict, accuracy: dict[int, float], target: float) -> dict:
    train = run["train"]
    start = train[0]["time_s"] - train[0]["step_time_s"]  # when the first step began
    span = train[-1]["time_s"] - train[0]["time_s"]
    reached = [step for step in sorted(accuracy) if accuracy[step] >= target]
    time_at = {row["step"]: row["time_s"] - start for row in train}
    return {
        "S": label if ":" in label else f"{label}:{run['config'].algo.loss.correction}", "steps": len(train),
        "steps_per_s": (len(train) - 1) / span if span > 0 else float("nan"),
        "train_wall_s": train[-1]["time_s"] - start,
        "time_to_target_s": time_at[reached[0]] if reached else None, "step_at_target": reached[0] if reached else None,
        "final_sampled": accuracy[max(accuracy)], "curve": accuracy,
        "staleness_mean": sum(r.get("staleness_mean", 0) for r in train) / len(train),
        "mismatch_k3": sum(r.get("mismatch_k3", 0) for r in train) / len(train),
        "is_truncated": sum(r.get("is_truncated", 0) for r in train) / len(train),
        **{stage: sum(r.get(stage, 0.0) for r in train) / len(train) for stage in STAGES},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", nargs="+", default=["0", "1:behaviour", "1:decoupled", "2:behaviour", "2:decoupled"],
                        help="S or S:correction per run; the first is the baseline of the ratios")
    parser.add_argument("--episodes", type=int, default=3)
    parser.add_argument("--save-every", type=int, default=16)
    parser.add_argument("--target", type=float, default=0.6, help="held-out sampled accuracy to time")
    parser.add_argument("--eval-seed", type=int, default=1234)
    parser.add_argument("--out", default=None, help="run directory (default: a temporary one)")
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    from coati.demo.math_demo import ensure_demo_assets

    demo = ensure_demo_assets(log=lambda message: None)
    out_dir = args.out or tempfile.mkdtemp(prefix="bench_async_")
    print(f"cores {os.cpu_count()}; {load()} before; runs in {out_dir}")
    runs = {}
    for label in args.runs:
        began = time.time()
        runs[label] = train(label, args.episodes, args.save_every, out_dir, demo)
        print(f"S={label}: {len(runs[label]['train'])} steps in {time.time() - began:.0f} s ({load()})", flush=True)
    print(f"{load()} after training")
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    rows = [summarise(s, run, evaluate_checkpoints(run["run_dir"], run["config"], args.eval_seed), args.target)
            for s, run in runs.items()]
    base = rows[0]
    print()
    print(f"| S | steps | steps/s | vs S={base['S']} | wall to sampled {args.target} | vs S={base['S']} | "
          "final sampled | staleness | mismatch k3 | IS capped |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        to_target = "not reached" if row["time_to_target_s"] is None else \
            f"{row['time_to_target_s']:.0f} s (step {row['step_at_target']})"
        ratio = "-" if row["time_to_target_s"] is None or base["time_to_target_s"] is None else \
            f"{base['time_to_target_s'] / row['time_to_target_s']:.2f}x"
        print(f"| {row['S']} | {row['steps']} | {row['steps_per_s']:.3f} | {row['steps_per_s'] / base['steps_per_s']:.2f}x"
              f" | {to_target} | {ratio} | {row['final_sampled']:.3f} | {row['staleness_mean']:.2f} | "
              f"{row['mismatch_k3']:.4f} | {row['is_truncated']:.4f} |")
    print()
    print("mean seconds per step: | S | " + " | ".join(STAGES) + " |")
    for row in rows:
        print(f"| {row['S']} | " + " | ".join(f"{row[stage]:.3f}" for stage in STAGES) + " |")
    print()
    for row in rows:
        curve = ", ".join(f"{step}: {acc:.3f}" for step, acc in sorted(row["curve"].items()))
        print(f"S={row['S']} held-out sampled accuracy by step: {curve}")
    print(f"{load()} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
