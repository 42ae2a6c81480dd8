"""--weight-sync collective: the bucket layout and checksum (hand-computed), and the group over real Ray actors
(gloo): identical weights on every producer, a corrupted bucket caught, timeouts that name the producer and the
version, and a producer restarted by Ray that gets the current weights without a new publish."""

import os
import sys
import time

import pytest
import ray
import torch
from ray import cloudpickle

from coati.cluster.collective_sync import (
    CollectiveSender,
    WeightSyncError,
    checksum,
    fill_buckets,
    mismatches,
    plan_buckets,
    tensor_views,
)
from coati.cluster.weight_store import WeightStore
from coati.cluster.weight_sync import collective_receiver, load_named_tensors


def test_plan_buckets_aligns_and_never_splits_a_tensor():
    specs = [("a", "float32", (3,)), ("b", "bfloat16", (5,)), ("c", "int64", (4,)), ("d", "float32", (20,)),
             ("e", "float32", (1,))]
    slots, sizes = plan_buckets(specs, bucket_bytes=32)
    # a: 12 bytes -> 16 padded; b: 10 -> 16, fills bucket 0; c: 32 alone; d: 80 > 32 gets its own; e: 4 -> 8
    assert [(s.name, s.bucket, s.offset, s.nbytes) for s in slots] == [
        ("a", 0, 0, 12), ("b", 0, 16, 10), ("c", 1, 0, 32), ("d", 2, 0, 80), ("e", 3, 0, 4)]
    assert sizes == [32, 32, 80, 8]


def test_checksum_sums_int64_words_modulo_2_to_the_64_and_mismatches_name_member_and_bucket():
    words = torch.tensor([1, 2, -1, 2**63 - 1, 1], dtype=torch.int64)
    assert checksum(words.view(torch.uint8)) == 2 - 2**63  # 2^63 + 2 wraps around to -2^63 + 2
    table = torch.tensor([[5, 7, 9], [5, 7, 9], [5, 8, 9], [6, 7, 0]])
    assert mismatches(table) == [(2, 1), (3, 0), (3, 2)]


def test_buckets_round_trip_every_dtype():
    tensors = [("w", torch.randn(3, 5)), ("h", torch.randn(7).to(torch.bfloat16)), ("i", torch.arange(6).view(2, 3)),
               ("m", torch.tensor([True, False, True]))]
    slots, sizes = plan_buckets([(n, str(t.dtype).removeprefix("torch."), tuple(t.shape)) for n, t in tensors], 64)
    buckets = [torch.zeros(size, dtype=torch.uint8) for size in sizes]
    fill_buckets(tensors, slots, buckets)
    for (name, tensor), (got_name, view) in zip(tensors, tensor_views(buckets, slots)):
        assert got_name == name and view.dtype == tensor.dtype and torch.equal(view, tensor)


def tiny_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 48), torch.nn.Linear(48, 16))
    model[1].to(torch.bfloat16)  # a dtype numpy has no name for
    return model


# pytest imports this file under a name Ray's workers cannot import: ship its classes and functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@ray.remote(num_cpus=0, max_restarts=1)
class Producer:
    """A stand-in for the producer actor: a model loaded from the collective receiver."""

    def __init__(self, store, rank: int, num_producers: int, timeout_s: float, corrupt: bool = False):
        torch.set_num_threads(1)
        self.model = tiny_model(seed=100 + rank)  # not the sender's weights
        self.version = 0
        self.receiver = collective_receiver(store, rank, num_producers, timeout_s)
        if corrupt:  # the fault: one byte of bucket 0 changes between the wire and the staging copy
            self.receiver._received = lambda index, bucket: bucket[:1].add_(1) if index == 0 else None

    def load(self, min_version: int, timeout_s: float = 60.0) -> int:
        self.version = self.receiver.load_newest(lambda named: load_named_tensors(self.model, named), self.version,
                                                 min_version, timeout_s)
        return self.version

    def pid(self) -> int:
        return os.getpid()

    def state(self) -> dict:
        return {name: tensor.clone() for name, tensor in self.model.state_dict().items()}

    def freeze(self) -> None:
        """A stuck producer: its staging copy stays locked (as during an endless load)."""
        self.receiver.staging_lock.acquire()


@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    yield
    ray.shutdown()


def start(num_producers: int, timeout_s: float = 60.0, bucket_mb: float = 0.001):
    """A sender in this process (buckets of 1 KiB: the tiny model spans four) and its WeightStore."""
    store = ray.remote(WeightStore).options(num_cpus=0).remote()
    sender = CollectiveSender(num_producers, bucket_mb, timeout_s, "gloo", host="127.0.0.1")
    ray.get(store.set_rendezvous.remote(sender.address))
    return store, sender


def publish(sender, version: int, model: torch.nn.Module) -> None:
    sender.publish(version, list(model.named_parameters()))


def restarted(producer, old_pid: int) -> None:
    """Wait until Ray has replaced the producer's killed process (calls fail or reach the old one until then)."""
    for _ in range(120):
        try:
            if ray.get(producer.pid.remote()) != old_pid:
                return
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
            pass
        time.sleep(0.5)
    raise AssertionError("the producer did not come back")


def assert_holds(producer, model):
    state = ray.get(producer.state.remote())
    for name, tensor in model.state_dict().items():
        assert state[name].dtype == tensor.dtype and torch.equal(state[name], tensor), name


def test_every_producer_holds_the_sent_weights_and_a_restarted_one_gets_them_at_once(ray_cluster):
    store, sender = start(2)
    producers = [Producer.remote(store, rank, 2, 60.0) for rank in range(2)]
    try:
        trained = tiny_model(seed=1)
        publish(sender, 1, trained)  # returns once both producers' checksums matched
        assert len(sender._layout[1]) == 4  # really several buckets
        assert ray.get([p.load.remote(1) for p in producers]) == [1, 1]
        for producer in producers:
            assert_holds(producer, trained)

        # Producer 1's process dies; Ray restarts it: a new incarnation registers, the group re-forms and version 1
        # is sent again by the sender's thread, with no new publish.
        pid = ray.get(producers[1].pid.remote())
        ray.kill(producers[1], no_restart=False)
        restarted(producers[1], pid)
        assert ray.get(producers[1].load.remote(1)) == 1
        assert_holds(producers[1], trained)
        assert sender.generation >= 2

        trained = tiny_model(seed=2)
        publish(sender, 2, trained)
        assert ray.get([p.load.remote(2) for p in producers]) == [2, 2]
        for producer in producers:
            assert_holds(producer, trained)
    finally:
        sender.close()
        for producer in producers:
            ray.kill(producer, no_restart=True)


def test_a_corrupted_bucket_is_one_clear_error_and_no_producer_keeps_the_version(ray_cluster):
    store, sender = start(2)
    producers = [Producer.remote(store, 0, 2, 60.0), Producer.remote(store, 1, 2, 60.0, corrupt=True)]
    try:
        with pytest.raises(WeightSyncError, match=r"producer 1 does not hold what was sent for version 1 \(bucket 0 of"):
            publish(sender, 1, tiny_model(seed=1))
        for rank, producer in enumerate(producers):  # all or nothing: producer 0's intact copy is discarded too
            with pytest.raises(TimeoutError, match=f"producer {rank} did not receive version 1 within 0.5 s .*"
                                                   "discarded version 1: producer 1's checksums differ"):
                ray.get(producer.load.remote(1, 0.5))
    finally:
        sender.close()
        for producer in producers:
            ray.kill(producer, no_restart=True)


@pytest.mark.e2e
def test_timeouts_name_the_producer_and_the_version(ray_cluster):
    store, sender = start(2, timeout_s=3.0)
    producers = [Producer.remote(store, rank, 2, 3.0) for rank in range(2)]
    try:
        ray.get([p.pid.remote() for p in producers])  # started (3 s would not cover Ray starting the processes)
        publish(sender, 1, tiny_model(seed=1))
        ray.get(producers[1].freeze.remote())
        with pytest.raises(TimeoutError, match=r"version 2 did not reach producer 1 within 3 s \(waiting for version "
                                               r"2's receivers to be ready"):
            publish(sender, 2, tiny_model(seed=2))
    finally:
        sender.close()
        for producer in producers:
            ray.kill(producer, no_restart=True)

    store, sender = start(2, timeout_s=2.0)
    lonely = Producer.remote(store, 0, 2, 2.0)  # producer 1 never starts
    try:
        ray.get(lonely.pid.remote())
        with pytest.raises(TimeoutError, match=r"version 1 did not reach producer 1 within 2 s \(waiting for "
                                               r"producers to register"):
            publish(sender, 1, tiny_model(seed=1))
    finally:
        sender.close()
        ray.kill(lonely, no_restart=True)


def test_flags_reach_the_config_with_one_default_and_bad_values_are_one_line(demo_assets):
    from coati.config.cli import build_parser, config_from_args
    from coati.config.errors import ConfigError
    from coati.config.layout import ParallelConfig

    def config(*argv):
        return config_from_args(build_parser().parse_args(list(argv)), demo_assets)

    assert config().parallel.weight_sync == ParallelConfig.weight_sync == "object-store"
    p = config("--weight-sync", "collective", "--weight-sync-bucket-mb", "32", "--weight-sync-timeout", "60").parallel
    assert (p.weight_sync, p.weight_sync_bucket_mb, p.weight_sync_timeout_s) == ("collective", 32.0, 60.0)
    with pytest.raises(ConfigError, match="--weight-sync-bucket-mb must be > 0, got 0"):
        config("--weight-sync", "collective", "--weight-sync-bucket-mb", "0")
    with pytest.raises(ConfigError, match="--weight-sync-timeout must be > 0 seconds, got -1"):
        config("--weight-sync-timeout", "-1")
