"""LoRA vs full fine-tuning at Qwen2.5-0.5B's shape on the single-process plugin: trainer peak RSS, seconds per
step, bytes per published weight version, and seconds to publish (gather + pack for the object store) and to load
one version into a transformers engine (the object-store path: pack + ``ray.put``, ``ray.get`` + copy in).

Random weights at the real shape (coati/models/scale.py's QWEN25_05B: 494M parameters, 151,936-row embedding),
one micro-batch of ``--batch`` x ``--seq`` tokens, GRPO's token log-probability loss, fp32 on the CPU. Each arm
runs in a fresh process: peak RSS (``ru_maxrss``) is read after the training steps, before the engine that
measures the load is built. One warm-up step, then ``--steps`` timed steps (median). The dry-run's trainer
estimate (coati/cluster/memory.py) is printed beside each arm.

    .venv/bin/python benchmarks/bench_lora.py [--rank 16] [--steps 2] [--threads 2]
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
from types import SimpleNamespace

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

GiB = 2**30


def build_model():
    import torch
    from transformers import Qwen2ForCausalLM

    from coati.models.scale import QWEN25_05B, model_config

    torch.manual_seed(0)
    return Qwen2ForCausalLM(model_config(QWEN25_05B, SimpleNamespace(pad_token_id=0, eos_token_id=1)))


def lora_config(rank: int):
    from coati.config.lora import LoraConfig

    return LoraConfig(lora_rank=rank, lora_alpha=2.0 * rank)


def measure(rank: int, steps: int, batch: int, seq: int) -> dict:
    import torch

    from coati.cluster.weight_sync import pack_named_tensors, unpack_named_tensors
    from coati.models.lora import add_adapters
    from coati.plugins.torch_single import SingleProcessPlugin
    from coati.algorithm.batch import token_logprobs
    from coati.rollout.inference_backend import TransformersBackend

    model = build_model()
    if rank:
        model = add_adapters(model, lora_config(rank))
    plugin = SingleProcessPlugin()
    plugin.setup(model, 1e-5)
    ids = torch.randint(3, 30000, (batch, seq), generator=torch.Generator().manual_seed(0))
    micro = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}

    def loss_fn(logits, micro_batch):
        loss = -token_logprobs(logits, micro_batch["input_ids"]).mean()
        return loss, {"loss": loss.detach()}

    times = []
    for step in range(steps + 1):
        start = time.perf_counter()
        plugin.forward_backward([micro], loss_fn)
        plugin.optimizer_step(1.0)
        if step:
            times.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GiB
    import ray

    ray.init(num_cpus=1, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    start = time.perf_counter()  # the object-store publish: gather, pack, one ray.put
    packed = pack_named_tensors(plugin.named_full_tensors())
    ref = ray.put(packed)
    publish_s = time.perf_counter() - start
    version_bytes = sum(array.nbytes for array, _ in packed.values())
    del packed
    engine_model = build_model()
    if rank:
        engine_model = add_adapters(engine_model, lora_config(rank))
    engine = TransformersBackend(engine_model, SimpleNamespace(eos_token_id=1, pad_token_id=0))
    start = time.perf_counter()  # a producer's load: the zero-copy read, then the copy into its model
    engine.load_weights(unpack_named_tensors(ray.get(ref)))
    load_s = time.perf_counter() - start
    ray.shutdown()
    trained = sum(p.numel() for p in plugin.model.parameters() if p.requires_grad)
    return {"rank": rank, "step_s": statistics.median(times), "peak_rss_gib": peak, "version_bytes": version_bytes,
            "publish_s": publish_s, "load_s": load_s, "trained_params": trained,
            "params": sum(p.numel() for p in plugin.model.parameters())}


def planned_gib(rank: int, batch: int, seq: int) -> float:
    from coati.cluster.memory import ModelShape, MemoryLayout, trainer_memory
    from coati.models.scale import QWEN25_05B as s

    shape = ModelShape(vocab=s.vocab_size, hidden=s.hidden_size, layers=s.num_layers, heads=s.num_heads,
                       kv_heads=s.num_kv_heads, intermediate=s.intermediate_size, tied=s.tie_embeddings)
    adapters = shape.adapter_params(rank) if rank else 0
    return trainer_memory(shape, MemoryLayout(adapter_params=adapters), batch, seq)["total"] / GiB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--arm", type=int, default=None, help=argparse.SUPPRESS)  # the child process's LoRA rank
    args = parser.parse_args()
    if args.arm is not None:
        import torch

        torch.set_num_threads(args.threads)
        print(json.dumps(measure(args.arm, args.steps, args.batch, args.seq)))
        return
    results = []
    for rank in (0, args.rank):  # full fine-tuning first, then LoRA, one fresh process each
        out = subprocess.run([sys.executable, __file__, "--arm", str(rank), "--steps", str(args.steps),
                              "--batch", str(args.batch), "--seq", str(args.seq), "--threads", str(args.threads)],
                             capture_output=True, text=True, check=True, cwd=REPO)
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    full, lora = results
    print(f"Qwen2.5-0.5B shape, {full['params'] / 1e6:.0f}M parameters; micro-batch {args.batch} x {args.seq} tokens; "
          f"{args.threads} threads; median of {args.steps} steps")
    print(f"{'arm':<14}{'trained':>12}{'peak RSS GiB':>14}{'planned GiB':>13}{'s/step':>9}{'version MB':>12}"
          f"{'publish s':>11}{'load s':>9}")
    for name, row in (("full", full), (f"LoRA r={args.rank}", lora)):
        print(f"{name:<14}{row['trained_params'] / 1e6:>11.2f}M{row['peak_rss_gib']:>14.2f}"
              f"{planned_gib(row['rank'], args.batch, args.seq):>13.2f}{row['step_s']:>9.2f}"
              f"{row['version_bytes'] / 1e6:>12.2f}{row['publish_s']:>11.3f}{row['load_s']:>9.3f}")
    print(f"full / LoRA: peak RSS {full['peak_rss_gib'] / lora['peak_rss_gib']:.2f}x, version bytes "
          f"{full['version_bytes'] / lora['version_bytes']:.0f}x, step time {full['step_s'] / lora['step_s']:.2f}x, "
          f"publish {full['publish_s'] / lora['publish_s']:.0f}x, load {full['load_s'] / lora['load_s']:.0f}x")


if __name__ == "__main__":
    main()
