"""Trainer plugins side by side: optimizer-state memory under sharding, and the plugin layer's step overhead.

1. Optimizer-state bytes per rank (AdamW exp_avg + exp_avg_sq + step) after one GRPO step of a Qwen2
   (hidden 256, 4 layers, fp32), sharded over 2 gloo ranks with ColossalAI LowLevelZero stage 2 and with
   torch FSDP2, against one unsharded rank (the single-process plugin). Target: <= 0.55x.
2. Step time of the 1-rank plugin (forward_backward + optimizer_step) against a bare PyTorch loop doing the
   same work on the same batch (forward, policy loss, backward per micro-batch, clip, AdamW step,
   zero_grad). Runs alternate A/B so machine noise hits both; medians. Target: <= 1.05x.

    .venv/bin/python benchmarks/bench_plugins.py [--steps 20] [--skip-memory]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from coati.models.tiny import TinyModelSpec, build_char_tokenizer, build_tiny_model  # noqa: E402
from tests.plugins.equivalence import grpo_batch, grpo_loss_fn, rank_micro_batches  # noqa: E402

SPEC = TinyModelSpec(hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=1024)


def build():
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(SPEC, tokenizer, seed=1)
    batch = grpo_batch(model.config.vocab_size, tokenizer.pad_token_id, num_groups=4, group_size=8)
    return model, batch


def optimizer_state_bytes(optimizer) -> int:
    from coati.plugins.dist import is_dtensor

    inner = getattr(optimizer, "optim", optimizer)  # ColossalAI wraps the torch optimizer
    total = 0
    for state in inner.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                local = value.to_local() if is_dtensor(value) else value
                total += local.numel() * local.element_size()
    return total


def memory_worker(layout: str, out: str) -> None:
    """One rank: one GRPO step under ``layout``, then rank 0 writes every rank's optimizer-state bytes."""
    import torch.distributed as dist

    from coati.plugins.dist import init_trainer_group
    from tests.plugins.equivalence import make_layout_plugin

    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    init_trainer_group(rank, world_size, "127.0.0.1", int(os.environ["MASTER_PORT"]))
    if layout.startswith("colossalai"):
        from coati.plugins.colossal import launch_colossalai

        launch_colossalai()
    model, batch = build()
    plugin = make_layout_plugin(layout)
    plugin.setup(model, 1e-4)
    plugin.forward_backward(rank_micro_batches(batch, plugin, 8), grpo_loss_fn)
    plugin.optimizer_step(1.0)
    sizes: list = [None] * world_size
    dist.all_gather_object(sizes, optimizer_state_bytes(plugin.optimizer))
    if rank == 0:
        with open(out, "w") as handle:
            json.dump(sizes, handle)


def run_ranks(layout: str, world_size: int = 2, timeout_s: float = 300) -> list[int]:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "sizes.json")
        procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--memory-worker", layout, "--out", out],
                                  env=dict(os.environ, RANK=str(r), WORLD_SIZE=str(world_size), MASTER_PORT=str(port),
                                           OMP_NUM_THREADS="1", PYTHONPATH=REPO),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
                 for r in range(world_size)]
        deadline = time.monotonic() + timeout_s
        try:
            for proc in procs:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        finally:
            for proc in procs:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        if not os.path.exists(out):
            errors = b"".join(proc.stderr.read()[-3000:] for proc in procs).decode(errors="replace")
            raise RuntimeError(f"{layout}: no result\n{errors}")
        with open(out) as handle:
            return json.load(handle)


def bench_memory() -> dict:
    from coati.plugins.torch_single import SingleProcessPlugin

    model, batch = build()
    plugin = SingleProcessPlugin()
    plugin.setup(model, 1e-4)
    plugin.forward_backward(rank_micro_batches(batch, plugin, 8), grpo_loss_fn)
    plugin.optimizer_step(1.0)
    unsharded = optimizer_state_bytes(plugin.optimizer)
    params = sum(p.numel() for p in model.parameters())
    print(f"model: {params / 1e6:.2f}M parameters; one unsharded rank holds {unsharded / 2**20:.2f} MiB of AdamW state")
    results = {"unsharded_bytes": unsharded}
    for name, layout in (("ZeRO-2 (colossalai-zero stage 2)", "colossalai-zero:zero=2"),
                         ("FSDP2 (torch-fsdp2)", "torch-fsdp2")):
        try:
            sizes = run_ranks(layout)
        except (RuntimeError, ModuleNotFoundError) as err:
            print(f"{name}: skipped ({str(err).splitlines()[0]})")
            continue
        ratio = max(sizes) / unsharded
        results[layout] = {"bytes_per_rank": sizes, "ratio": ratio}
        verdict = "ok" if ratio <= 0.55 else "OVER TARGET"
        print(f"{name} over 2 ranks: {', '.join(f'{s / 2**20:.2f}' for s in sizes)} MiB per rank -> "
              f"{ratio:.3f}x of one unsharded rank (target <= 0.55: {verdict})")
    return results


def plugin_for_split():
    from coati.plugins.torch_single import SingleProcessPlugin

    return SingleProcessPlugin()


def bench_step_time(steps: int) -> dict:
    from coati.plugins.torch_single import SingleProcessPlugin

    torch.set_num_threads(1)  # the host is shared: one thread keeps both sides equally exposed to noise
    from coati.plugins import make_plugin

    model_a, batch = build()
    model_b, _ = build()
    model_c, _ = build()
    micro = rank_micro_batches(batch, plugin_for_split(), 8)
    plugin = SingleProcessPlugin()
    plugin.setup(model_a, 1e-4)
    native = make_plugin("torch-ddp")  # 1 rank, no process group: the torch-native code path, no DDP wrapper
    native.setup(model_c, 1e-4)
    optimizer = torch.optim.AdamW(model_b.parameters(), lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0)
    model_b.train()

    def plugin_step():
        plugin.forward_backward(micro, grpo_loss_fn)
        plugin.optimizer_step(1.0)

    def native_step():
        native.forward_backward(micro, grpo_loss_fn)
        native.optimizer_step(1.0)

    def bare_step():
        for mb in micro:
            logits = model_b(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"]).logits
            loss, _ = grpo_loss_fn(logits, mb)
            loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in model_b.parameters() if p.grad is not None], 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    contenders = [("plugin", plugin_step), ("bare", bare_step), ("native", native_step)]
    for _ in range(3):  # warm-up
        for _, step in contenders:
            step()
    times = {name: [] for name, _ in contenders}
    for i in range(steps):
        for name, step in contenders[i % 3:] + contenders[: i % 3]:  # rotate the order
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)
    plugin_s, bare_s = statistics.median(times["plugin"]), statistics.median(times["bare"])
    ratio = plugin_s / bare_s
    verdict = "ok" if ratio <= 1.05 else "OVER TARGET"
    print(f"step time, {len(micro)} micro-batches of 8 ({batch['input_ids'].shape[1]} tokens), median of {steps}: "
          f"plugin 'single' {plugin_s * 1e3:.1f} ms, bare PyTorch loop {bare_s * 1e3:.1f} ms -> {ratio:.3f}x "
          f"(target <= 1.05: {verdict})")
    native_s = statistics.median(times["native"])
    print(f"  (torch-ddp plugin on 1 rank, the torch-native code path: {native_s * 1e3:.1f} ms -> "
          f"{native_s / bare_s:.3f}x)")
    return {"plugin_s": plugin_s, "bare_s": bare_s, "ratio": ratio, "native_ratio": native_s / bare_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--memory-worker", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_worker:
        code = 0
        try:
            memory_worker(args.memory_worker, args.out)
        except BaseException:  # noqa: BLE001
            import traceback

            traceback.print_exc()
            code = 1
        sys.stderr.flush()
        os._exit(code)  # no interpreter shutdown: ColossalAI runs sometimes hang there
    if not args.skip_memory:
        bench_memory()
    bench_step_time(args.steps)


if __name__ == "__main__":
    main()
