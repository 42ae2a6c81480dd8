"""Weight sync throughput, trainer -> N inferencer actors, side by side with an in-process copy.

Transports measured in one run on the same state dict:
  copy       in-process ``copy_`` into preallocated tensors (the ceiling)
  numpy      what the system uses: one ``ray.put`` of numpy arrays, each actor reads zero-copy and loads
  torch      one ``ray.put`` of torch tensors (pickled), each actor loads
Prints bytes/s and the ratio to the in-process copy. Usage: python benchmarks/bench_weight_sync.py [--mb 256]
"""

from __future__ import annotations

import argparse
import time

import ray
import torch

from coati.distributed.weight_sync import pack_named_tensors, unpack_named_tensors


def make_state(total_mb: int, tensor_mb: int = 16) -> dict[str, torch.Tensor]:
    numel = tensor_mb * 2**20 // 4
    return {f"layer{i}.weight": torch.randn(numel) for i in range(max(1, total_mb // tensor_mb))}


@ray.remote(num_cpus=0)
class Receiver:
    def __init__(self, shapes: dict[str, tuple]):
        self.params = {name: torch.empty(shape) for name, shape in shapes.items()}

    def load_numpy(self, refs: list) -> int:
        for name, tensor in unpack_named_tensors(ray.get(refs[0])):
            self.params[name].copy_(tensor)
        return len(self.params)

    def load_torch(self, refs: list) -> int:
        for name, tensor in ray.get(refs[0]).items():
            self.params[name].copy_(tensor)
        return len(self.params)


def best_of(repeats: int, fn) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=256, help="state dict size in MiB")
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR",
             object_store_memory=max(4 * args.mb * 2**20, 512 * 2**20))
    state = make_state(args.mb)
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    receivers = [Receiver.remote({k: tuple(v.shape) for k, v in state.items()}) for _ in range(args.actors)]
    ray.get([r.__ray_ready__.remote() for r in receivers])

    targets = {name: torch.empty_like(t) for name, t in state.items()}

    def in_process():
        for _ in range(args.actors):
            for name, tensor in state.items():
                targets[name].copy_(tensor)

    def via_numpy():
        ref = ray.put(pack_named_tensors(state.items()))
        ray.get([r.load_numpy.remote([ref]) for r in receivers])

    def via_torch():
        ref = ray.put(state)
        ray.get([r.load_torch.remote([ref]) for r in receivers])

    results = {"copy": best_of(args.repeats, in_process), "numpy": best_of(args.repeats, via_numpy),
               "torch": best_of(args.repeats, via_torch)}
    delivered = nbytes * args.actors
    print(f"state dict {nbytes / 2**20:.0f} MiB to {args.actors} actors (best of {args.repeats})")
    print(f"{'transport':<10}{'seconds':>10}{'GB/s':>10}{'vs copy':>10}")
    for name, seconds in results.items():
        print(f"{name:<10}{seconds:>10.3f}{delivered / seconds / 1e9:>10.2f}{results['copy'] / seconds:>10.2f}")
    ray.shutdown()


if __name__ == "__main__":
    main()
