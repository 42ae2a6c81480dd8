"""Multi-rank trainer groups as real Ray actors: the same rollouts give the same losses and the same weights
under every layout as under one process (real buffer and weight-store actors, gloo on localhost).

Every layout trains 2 steps over the same 8 groups (4 per step: tbs=4 per step for tp/pp, tbs=2 per
data-parallel rank for dp=2), then the full weights are compared with the single-process run.
"""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import ray
import torch

from coati.cluster.buffer import RolloutBuffer
from coati.cluster.weight_store import WeightStore
from coati.cluster.weight_sync import unpack_named_tensors
from coati.config.cli import build_parser, config_from_args
from coati.trainer.consumer import Consumer
from tests.plugins.equivalence import grpo_groups
from tests.trainer.native_crash import fatal_signal_logs

G = 4
NUM_GROUPS = 8


def rollouts(correct_pattern=None) -> list:
    groups = grpo_groups(vocab_size=90, pad_id=0, num_groups=NUM_GROUPS, group_size=G, seed=3)
    if correct_pattern is None:
        return groups
    # DAPO's filter keeps groups with accuracy in [0.01, 0.99]: all-right / all-wrong groups are dropped
    return [dataclasses.replace(g, correct=[i < correct_pattern[n % len(correct_pattern)] for i in range(G)])
            for n, g in enumerate(groups)]


def train(model_dir: str, flags: list[str], groups: list, tbs: int, after_step=None) -> tuple[list[dict], dict, int]:
    """(metrics of every step, full weights after training, weight versions published) for one layout;
    ``after_step(consumers, results)`` runs between steps, as the driver's evaluation snapshots do.

    A run one of whose workers died of a fatal signal (its log says so: tests/trainer/native_crash.py) is run
    once more, with a warning carrying that log's end; any other failure, or a second crash, fails the test."""
    crashed_before = fatal_signal_logs()
    try:
        return train_once(model_dir, flags, groups, tbs, after_step)
    except ray.exceptions.RayError:
        crashes = {path: text for path, text in fatal_signal_logs().items() if path not in crashed_before}
        if not crashes or after_step is not None:  # after_step may keep state from the first attempt
            raise
    path, text = next(iter(crashes.items()))
    warnings.warn(f"a trainer-group worker crashed natively; running {flags} once more. {path}:\n{text[-3000:]}",
                  stacklevel=2)
    return train_once(model_dir, flags, groups, tbs, after_step)


def train_once(model_dir: str, flags: list[str], groups: list, tbs: int, after_step=None):
    argv = ["-m", model_dir, "-d", "unused.jsonl", "-g", str(G), "-ibs", str(NUM_GROUPS), "-imbs", str(NUM_GROUPS),
            "-tbs", str(tbs), "-tMbs", str(tbs), "-tmbs", "4", "-lr", "1e-4", "--no-progress", *flags]
    config = config_from_args(build_parser().parse_args(argv))
    store = ray.remote(WeightStore).options(num_cpus=0).remote()
    buffer = ray.remote(RolloutBuffer).options(num_cpus=0).remote(2 * NUM_GROUPS)
    ray.get(buffer.put.remote(groups))
    world = config.parallel.num_trainers
    actor = ray.remote(Consumer).options(num_cpus=1)
    consumers = [actor.remote(config, rank, buffer, store, 1) for rank in range(world)]
    try:
        address, port = ray.get(consumers[0].rendezvous_address.remote())
        ray.get([c.setup.remote(address, port) for c in consumers], timeout=300)
        ray.get([c.set_total_groups.remote(NUM_GROUPS) for c in consumers])
        rows = []
        while True:
            results = ray.get([c.step.remote() for c in consumers], timeout=300)
            if results[0] is None:
                assert all(r is None for r in results), "ranks disagree on the end of the data"
                break
            assert len({r.get("groups_kept") for r in results}) == 1, "ranks disagree on the kept groups"
            rows.append(results[0])
            if after_step is not None:
                after_step(consumers, results)
        state = ray.get([c.full_state.remote() for c in consumers], timeout=300)[0]
        version, refs = ray.get(store.wait_for.remote(0, 10.0))
        published = dict(unpack_named_tensors(ray.get(refs[0])))
        assert published.keys() == state.keys()
        assert all(torch.equal(published[name], state[name]) for name in state), "published weights are stale"
        ray.get([c.shutdown.remote() for c in consumers], timeout=120)
        return rows, state, version
    finally:
        for handle in consumers:
            ray.kill(handle)


def assert_same_run(reference, candidate, label, weight_tol=1e-5):
    ref_rows, ref_state, ref_version = reference
    rows, state, version = candidate
    assert [r.get("groups_kept") for r in rows] == [r.get("groups_kept") for r in ref_rows], label
    for ref_row, row in zip(ref_rows, rows):
        assert "skipped" not in row
        assert row["loss"] == pytest.approx(ref_row["loss"], abs=1e-6), label
        assert row["grad_norm"] == pytest.approx(ref_row["grad_norm"], rel=1e-5), label
        assert row["skipped_samples"] == ref_row["skipped_samples"], label
    assert version == ref_version, label
    assert state.keys() == ref_state.keys(), label
    diff = max(float((state[name] - ref_state[name]).abs().max()) for name in state)
    assert diff <= weight_tol, f"{label}: weights differ by {diff:.2e}"


# torch DDP x2 against one process: test_dapo_filtering_over_two_data_parallel_ranks, twice. Torch TP x2's step
# equals one process's in tests/plugins/test_equivalence.py; through the consumer, two ranks that share one batch
# (dp 1) run here as torch PP and ColossalAI Hybrid TP.
LAYOUTS = [
    # torch FSDP2 x2 (zero 2): test_eval_snapshots_and_rollout_records_over_two_ranks, which also snapshots
    ("torch PP x2", ["-t", "2", "-pp", "2"], 4),
    # One ColossalAI layout through the consumer (its shardformer model under token-budget micro-batches); each
    # ColossalAI layout's step equals one process's in tests/plugins/test_equivalence.py, and Hybrid PP runs whole
    # through the CLI in tests/e2e/test_trainer_group_e2e.py (LowLevelZero and Hybrid PP were here too, ~55 s each).
    ("colossalai Hybrid TP x2", ["-t", "2", "--plugin", "colossalai", "-tp", "2"], 4),
]


def test_cpu_trainer_ranks_start_with_an_allocator_that_keeps_freed_memory(local_ray):
    """A CPU rank's process starts with glibc's tunables that keep freed memory in the heap (each step's large
    tensors then reuse it instead of page-faulting it in again); a GPU rank's options stay as they were."""
    from coati.cluster.trainer_group import start_trainer_group, with_cpu_allocator
    from coati.utils.machine import CPU_TRAINER_MALLOC_ENV
    from tests.trainer.environ_probe import EnvironProbe

    group = start_trainer_group(EnvironProbe, 2, {}, [1, 1], lambda rank: {"num_cpus": 0})
    try:
        assert group.call("environ", list(CPU_TRAINER_MALLOC_ENV)) == [CPU_TRAINER_MALLOC_ENV] * 2
    finally:
        group.kill()
    assert with_cpu_allocator({"num_cpus": 1, "num_gpus": 1}) == {"num_cpus": 1, "num_gpus": 1}


@pytest.fixture(scope="module")
def single_run(local_ray, tiny_model_dir):
    return train(tiny_model_dir, [], rollouts(), tbs=4)


def test_single_process_run_trains_and_publishes(single_run):
    rows, state, version = single_run
    assert len(rows) == 2 and version == 1  # one round of 8 groups -> one publish, after the second step
    assert all(r["groups_kept"] == 4 for r in rows)


@pytest.mark.e2e
@pytest.mark.parametrize("label, flags, tbs", LAYOUTS, ids=[layout[0] for layout in LAYOUTS])
def test_layout_matches_single_process(local_ray, tiny_model_dir, single_run, label, flags, tbs):
    if "colossalai" in flags:
        pytest.importorskip("colossalai", reason="ColossalAI not installed (bash scripts/install_colossalai.sh .venv)")
    assert_same_run(single_run, train(tiny_model_dir, flags, rollouts(), tbs), label)


@pytest.mark.e2e
def test_dapo_filtering_over_two_data_parallel_ranks(local_ray, tiny_model_dir):
    """DAPO drops all-right/all-wrong groups: 5 of 8 survive, a round of 20 samples in 2 steps of 10, 5 per
    rank; the result equals one process's. Whole groups per step: 4, then 1 when the data runs out, so in the
    second step rank 1 has no share and trains a loss-masked placeholder."""
    pattern = [2, 4, 1, 0, 3, 2, 4, 1]  # correct answers per group (G=4): groups 1, 3, 6 are filtered out
    flags = ["-a", "DAPO"]
    reference = train(tiny_model_dir, flags, rollouts(pattern), tbs=4)
    candidate = train(tiny_model_dir, [*flags, "-t", "2"], rollouts(pattern), tbs=2)
    assert [r["groups_kept"] for r in reference[0]] == [3, 2]  # the round's 5 in draw order, for the metrics
    assert [r["groups_filtered"] for r in reference[0]] == [3, 0] and [r["samples"] for r in reference[0]] == [10, 10]
    assert_same_run(reference, candidate, "DAPO torch DDP x2")
    flags.append("--no-round-minibatches")
    reference = train(tiny_model_dir, flags, rollouts(pattern), tbs=4)
    candidate = train(tiny_model_dir, [*flags, "-t", "2"], rollouts(pattern), tbs=2)
    assert [r["groups_kept"] for r in reference[0]] == [4, 1]
    assert [r["groups_filtered"] for r in reference[0]] == [2, 1]
    assert_same_run(reference, candidate, "DAPO torch DDP x2, whole groups")


@pytest.mark.e2e
def test_eval_snapshots_and_rollout_records_over_two_ranks(local_ray, tiny_model_dir, single_run, tmp_path):
    """Torch FSDP2 x2 (zero 2) trains as one process does, snapshots and rollout records included: -ei's weight
    snapshot is collective (FSDP2 shards are gathered) and holds exactly the current weights, mid-round (one
    extra gather) or right after a publish (the published object); -rsd records come from rank 0 alone, at a
    round's first step, and cover the whole round."""
    snapshots_seen = []

    def after_step(consumers, results):
        snapshots = ray.get([c.snapshot_weights.remote() for c in consumers], timeout=300)
        assert sum(refs is not None for _, refs, _ in snapshots) == 1  # the sender's
        assert len({(version, on_sync) for version, _, on_sync in snapshots}) == 1  # every rank agrees
        refs = next(refs for _, refs, _ in snapshots if refs is not None)
        current = ray.get([c.full_state.remote() for c in consumers], timeout=300)[0]
        weights = dict(unpack_named_tensors(ray.get(refs[0])))
        assert weights.keys() == current.keys() and all(torch.equal(weights[n], current[n]) for n in current)
        snapshots_seen.append(snapshots[0][0::2])
        assert all("rollouts" not in r for r in results[1:])

    flags = ["-t", "2", "-zero", "2", "-rsd", str(tmp_path)]
    rows, state, version = train(tiny_model_dir, flags, rollouts(), 2, after_step)
    assert_same_run(single_run, (rows, state, version), "torch FSDP2 x2 (zero 2)")
    assert snapshots_seen == [(0, False), (1, True)]  # step 1: mid-round; step 2 drew the round and published
    assert "rollouts" not in rows[1]
    records = rows[0]["rollouts"]
    assert len(records) == NUM_GROUPS * G and {r["step"] for r in records} == {1}  # the round, both ranks' parts
    for group in range(NUM_GROUPS):
            assert sum(r["advantage"] for r in records[group * G : (group + 1) * G]) == pytest.approx(0, abs=1e-5)
