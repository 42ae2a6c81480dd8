"""Gradient checkpointing on vs off: peak RSS and seconds per training step of the single-process plugin.

A Qwen2 of hidden 512, 8 layers (25M parameters, character vocabulary), one micro-batch of 8 x 512 tokens, the
token log-probability loss of GRPO, fp32 on the CPU. Each mode runs in a fresh process (peak RSS is the
process's ``ru_maxrss``), one warm-up step then ``--steps`` timed steps (median). The planned activation bytes
of coati/cluster/memory.py are printed beside the measurement.

    .venv/bin/python benchmarks/bench_gradient_checkpointing.py [--steps 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

BATCH, SEQ = 8, 512
SHAPE = dict(hidden_size=512, num_layers=8, num_heads=8, num_kv_heads=4, intermediate_size=2048, max_positions=1024)


def measure(checkpointing: bool, steps: int) -> dict:
    import torch

    from coati.models.tiny import TinyModelSpec, build_char_tokenizer, build_tiny_model
    from coati.plugins import make_plugin
    from coati.algorithm.batch import token_logprobs

    tokenizer = build_char_tokenizer()
    model = build_tiny_model(TinyModelSpec(**SHAPE), tokenizer, seed=1)
    plugin = make_plugin("single")
    plugin.setup(model, 1e-4, gradient_checkpointing=checkpointing)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (BATCH, SEQ), generator=generator)
    micro = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}

    def loss_fn(logits, batch):
        loss = -token_logprobs(logits, batch["input_ids"]).mean()
        return loss, {"loss": loss.detach()}

    times = []
    for step in range(steps + 1):
        start = time.perf_counter()
        plugin.forward_backward([micro], loss_fn)
        plugin.optimizer_step(1.0)  # returns the norm as a float: the step has finished on a GPU too
        if step:  # the first step warms up
            times.append(time.perf_counter() - start)
    rss_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30
    gpu_gib = torch.cuda.max_memory_allocated() / 2**30 if plugin.device.type == "cuda" else 0.0
    return {"checkpointing": checkpointing, "step_s": statistics.median(times), "peak_rss_gib": rss_gib,
            "peak_gpu_gib": gpu_gib, "device": str(plugin.device), "params": sum(p.numel() for p in model.parameters())}


def planned_activations(checkpointing: bool) -> float:
    from coati.cluster.memory import ModelShape, MemoryLayout, activation_bytes

    shape = ModelShape(vocab=0, hidden=SHAPE["hidden_size"], layers=SHAPE["num_layers"], heads=SHAPE["num_heads"],
                       kv_heads=SHAPE["num_kv_heads"], intermediate=SHAPE["intermediate_size"])
    return activation_bytes(shape, MemoryLayout(checkpointing=checkpointing), BATCH, SEQ)["activations"] / 2**30


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--child", choices=("on", "off"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        import torch

        torch.set_num_threads(args.threads)
        print(json.dumps(measure(args.child == "on", args.steps)))
        return
    results = {}
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), PYTHONPATH=REPO)
    for mode in ("off", "on"):
        out = subprocess.run([sys.executable, __file__, "--child", mode, "--steps", str(args.steps),
                              "--threads", str(args.threads)], env=env, capture_output=True, text=True, check=True)
        results[mode] = json.loads(out.stdout.strip().splitlines()[-1])
        gpu = f", peak GPU {results[mode]['peak_gpu_gib']:.3f} GiB" if results[mode]["peak_gpu_gib"] else ""
        print(f"checkpointing {mode:3s} on {results[mode]['device']}: {results[mode]['step_s']:.3f} s/step, peak RSS "
              f"{results[mode]['peak_rss_gib']:.2f} GiB{gpu} (planned activations "
              f"{planned_activations(mode == 'on'):.3f} GiB)")
    on, off = results["on"], results["off"]
    print(f"{off['params'] / 1e6:.1f}M parameters, {BATCH} x {SEQ} tokens, {args.threads} thread(s): "
          f"on/off step time {on['step_s'] / off['step_s']:.2f}x, peak RSS {on['peak_rss_gib'] / off['peak_rss_gib']:.2f}x")


if __name__ == "__main__":
    main()
