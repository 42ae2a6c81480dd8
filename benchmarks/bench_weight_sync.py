"""Weight sync throughput, trainer -> N inferencer actors: object store vs collective, side by side.

Runs on a two-node Ray cluster started on this machine (``ray.cluster_utils.Cluster``: two raylets with two
object stores, stopped at the end). The sending "trainer" actor sits on node A; the inferencer actors on node B
("cross-node"), then, in a second placement, on node A beside it ("same node"). Per placement:
  copy          in-process ``copy_`` of the state dict into N preallocated copies (the ceiling)
  object-store  what ``--weight-sync object-store`` does: one ``ray.put`` of numpy arrays, every actor reads it
                (zero-copy on its node; the object manager moves it across nodes once per node) and loads it
  collective    what ``--weight-sync collective`` does: bucketed gloo broadcasts from the trainer to every actor,
                per-bucket checksums compared, then every actor loads its staging copy
Time: from the publish call until every actor holds the weights in its own tensors (best of --repeats, after one
untimed warm-up that also forms the collective group). Prints GB/s delivered (state bytes x actors / time) and
the ratio to the in-process copy. Usage: python benchmarks/bench_weight_sync.py [--mb 256] [--actors 2]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import time

import ray
import torch

from coati.cluster.weight_sync import (
    CollectivePublisher,
    ObjectStorePublisher,
    ObjectStoreReceiver,
    WeightStore,
    collective_receiver,
)

TRANSPORTS = ("object-store", "collective")


def make_state(total_mb: int, tensor_mb: int = 16) -> dict[str, torch.Tensor]:
    numel = tensor_mb * 2**20 // 4
    return {f"layer{i}.weight": torch.randn(numel) for i in range(max(1, total_mb // tensor_mb))}


@ray.remote(num_cpus=0)
class Trainer:
    def __init__(self, total_mb: int, stores: dict, num_actors: int, bucket_mb: float):
        torch.set_num_threads(1)
        self.state = make_state(total_mb)
        self.publishers = {"object-store": ObjectStorePublisher(stores["object-store"]),
                           "collective": CollectivePublisher(stores["collective"], num_actors, bucket_mb, 600.0)}
        self.targets = [{name: torch.empty_like(t) for name, t in self.state.items()} for _ in range(num_actors)]

    def shapes(self) -> dict:
        return {name: tuple(t.shape) for name, t in self.state.items()}

    def publish(self, transport: str, version: int) -> None:
        self.publishers[transport].publish(version, self.state.items())

    def copy(self) -> float:
        start = time.perf_counter()
        for target in self.targets:
            for name, tensor in self.state.items():
                target[name].copy_(tensor)
        return time.perf_counter() - start

    def close(self) -> None:
        self.publishers["collective"].close()


@ray.remote(num_cpus=0)
class Inferencer:
    def __init__(self, shapes: dict, rank: int, num_actors: int, stores: dict):
        torch.set_num_threads(1)
        self.params = {name: torch.empty(shape) for name, shape in shapes.items()}
        self.receivers = {"object-store": ObjectStoreReceiver(stores["object-store"], rank),
                          "collective": collective_receiver(stores["collective"], rank, num_actors, 600.0)}
        self.versions = dict.fromkeys(TRANSPORTS, 0)

    def load(self, transport: str, version: int) -> None:
        self.versions[transport] = self.receivers[transport].load_newest(self._load, self.versions[transport],
                                                                         version, 600.0)
        assert self.versions[transport] == version

    def _load(self, named_tensors) -> None:
        for name, tensor in named_tensors:
            self.params[name].copy_(tensor)

    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()


def measure(placement: str, args) -> dict[str, float]:
    stores = {t: ray.remote(WeightStore).options(num_cpus=0, resources={"node_a": 0.01}).remote() for t in TRANSPORTS}
    trainer = Trainer.options(resources={"node_a": 0.01}).remote(args.mb, stores, args.actors, args.bucket_mb)
    shapes = ray.get(trainer.shapes.remote())
    node = "node_b" if placement == "cross-node" else "node_a"
    actors = [Inferencer.options(resources={node: 0.01}).remote(shapes, rank, args.actors, stores)
              for rank in range(args.actors)]
    ray.get([a.node.remote() for a in actors])
    versions = itertools.count(1)

    def sync(transport):
        version = next(versions)
        ray.get(trainer.publish.remote(transport, version))
        ray.get([a.load.remote(transport, version) for a in actors])

    results = {"copy": min(ray.get(trainer.copy.remote()) for _ in range(args.repeats))}
    for transport in TRANSPORTS:
        versions = itertools.count(1)
        sync(transport)  # warm-up (forms the collective group)
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            sync(transport)
            times.append(time.perf_counter() - start)
        results[transport] = min(times)
    ray.get(trainer.close.remote())
    for handle in [trainer, *actors, *stores.values()]:
        ray.kill(handle)
    return results


@contextlib.contextmanager
def private_cluster_address():
    """ray.cluster_utils.Cluster writes its address to /tmp/ray/ray_current_cluster (and deletes that file at
    shutdown), where any other ``ray.init()`` on this machine would find it and join this benchmark's cluster.
    The driver here connects by address, so the file is neither written nor removed."""
    import ray._common.utils
    import ray._private.utils

    saved = ray._private.utils.write_ray_address, ray._common.utils.reset_ray_address
    ray._private.utils.write_ray_address = ray._common.utils.reset_ray_address = lambda *args, **kwargs: None
    try:
        yield
    finally:
        ray._private.utils.write_ray_address, ray._common.utils.reset_ray_address = saved


def main() -> None:
    from ray.cluster_utils import Cluster

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=256, help="state dict size in MiB")
    parser.add_argument("--actors", type=int, default=2, help="inferencer actors")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bucket-mb", type=float, default=128.0, help="--weight-sync-bucket-mb")
    args = parser.parse_args()
    store_bytes = max(4 * args.mb * 2**20, 512 * 2**20)
    with private_cluster_address():
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"node_a": 1},
                                                                "object_store_memory": store_bytes,
                                                                "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=1, resources={"node_b": 1}, object_store_memory=store_bytes)
        ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
        nbytes = args.mb // 16 * 16 * 2**20
        delivered = nbytes * args.actors
        print(f"state dict {nbytes / 2**20:.0f} MiB from node A to {args.actors} actors, two-node Ray cluster on this "
              f"machine, buckets {args.bucket_mb:g} MiB (best of {args.repeats})")
        print(f"{'placement':<12}{'transport':<14}{'seconds':>10}{'GB/s':>10}{'vs copy':>10}")
        for placement in ("cross-node", "same node"):
            results = measure(placement, args)
            for name, seconds in results.items():
                print(f"{placement:<12}{name:<14}{seconds:>10.3f}{delivered / seconds / 1e9:>10.2f}"
                      f"{results['copy'] / seconds:>10.2f}")
    finally:
        ray.shutdown()
        with private_cluster_address():
            cluster.shutdown()


if __name__ == "__main__":
    main()
