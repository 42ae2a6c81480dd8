"""Multi-node runs on a real two-node Ray cluster on this machine (two ``ray start`` processes, token auth on):
joining with --master_address, placement by node, a killed inferencer that comes back, a killed trainer rank
that stops the run with the checkpoint to resume from, and one-line errors for auth and missing resources.

The head has 1 CPU slot and the worker 2: with -i 1 -t 2 the trainer group (placed first, PACK) can only go
to the worker, and the inferencer to the head. Every run is the demo model on a few prompts (-e 1).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter

import pytest
import ray

from tests.ray_nodes import ROOT, RayNodes, clean_env
from tests.run_helpers import Gate, head, timed_cli

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]
SMALL = ["-ibs", "4", "-imbs", "4", "-g", "2", "-tbs", "2", "-tMbs", "2", "-tmbs", "4", "-e", "1", "--no-progress"]


@pytest.fixture(scope="module")
def cluster():
    # Not under pytest's temp dir: with an xdist worker's part added, Ray's socket paths would pass 107 characters.
    root = tempfile.mkdtemp(prefix="coati-ray-")
    nodes = RayNodes(root)
    try:
        nodes.start_head(num_cpus=1)
        nodes.add_worker(num_cpus=2)
        yield nodes
    finally:
        left = nodes.stop()
        shutil.rmtree(root, ignore_errors=True)
    assert not left, f"processes of the test cluster survived stop(): {left}"


@pytest.fixture(scope="module")
def node_ids(cluster):
    listed = cluster.nodes()
    assert len(listed) == 2
    return {("head" if node["is_head"] else "worker"): node["node_id"] for node in listed}


@pytest.fixture(scope="module")
def data(demo_assets, tmp_path_factory):
    folder = tmp_path_factory.mktemp("data")
    return {n: head(demo_assets.train_path, folder / f"train{n}.jsonl", n) for n in (16, 32, 48)}


def cache_env(demo_assets) -> dict:
    return {"COATI_CACHE": os.path.dirname(os.path.dirname(demo_assets.model_dir))}


def driver(argv: list[str], env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "rl_example.py", *argv], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def finish(proc: subprocess.Popen, timeout: float = 400) -> tuple[str, str]:
    out, err = proc.communicate(timeout=timeout)
    return out, err


def train_steps(run_dir: str) -> list[int]:
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        return []
    rows = [json.loads(line) for line in open(path) if line.strip()]
    return [row["step"] for row in rows if row.get("kind") == "train"]


def wait_for(condition, proc: subprocess.Popen, timeout: float = 300, what: str = "") -> None:
    deadline = time.time() + timeout
    while not condition():
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"the run ended before {what}:\n{out[-2000:]}\n{err[-3000:]}")
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def test_a_local_run_neither_joins_nor_disturbs_a_running_cluster(cluster, demo_assets, data, monkeypatch):
    """``ray.init()`` without an address joins the cluster ``ray start`` recorded in the temp dir; a local run
    (no --master_address, no RAY_ADDRESS) must start its own, even with that very temp dir as --ray_dir."""
    from coati.launcher.rl import init_ray
    from coati.config.cli import build_parser, config_from_args

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    head_dir = cluster.temp_dirs[0]
    assert open(os.path.join(head_dir, "ray_current_cluster")).read().strip().endswith(f":{cluster.port}")
    config = config_from_args(build_parser().parse_args(["-d", data[16], "--ray_dir", head_dir]), demo_assets)
    init_ray(config)
    try:
        assert ray.get_runtime_context().gcs_address != cluster.address
        assert ray.cluster_resources()["CPU"] >= 2  # its own (the running cluster has 3 CPUs over 2 nodes)
    finally:
        ray.shutdown()
    assert cluster.alive() and len(cluster.nodes()) == 2


@pytest.mark.parametrize("auth, expected", [
    ({}, "requires its authentication token: export RAY_AUTH_MODE=token"),
    ({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64}, "rejected this process's token"),
], ids=["no-token", "wrong-token"])
def test_auth_failure_is_one_line(cluster, data, demo_assets, tmp_path, auth, expected):
    env = clean_env(HOME=str(tmp_path), **cache_env(demo_assets), **auth)  # no ~/.ray/auth_token either
    output, seconds = timed_cli(["--master_address", cluster.address, "-d", data[16], *SMALL, "-sd", str(tmp_path)],
                                env, tmp_path)
    assert len(output) == 1 and output[0].startswith("error: ") and expected in output[0], output
    assert seconds < 15


def test_missing_resources_is_one_line(cluster, data, demo_assets, tmp_path):
    output, seconds = timed_cli(["--master_address", cluster.address, "-d", data[16], "-i", "2", "-t", "2", *SMALL,
                                 "-sd", str(tmp_path)], cluster.env(**cache_env(demo_assets)), tmp_path)
    assert output == ["error: -i 2 -t 2 needs 4 CPUs (one per inferencer and trainer rank); the cluster has 3: add "
                      "nodes, or train and generate on the trainers' CPUs (it fits): --colocate -t 2"], output
    assert seconds < 15


def test_wrong_ray_dir_is_one_line(cluster, data, demo_assets, tmp_path):
    output, seconds = timed_cli(["--master_address", cluster.address, "--ray_dir", str(tmp_path), "-d", data[16],
                                 *SMALL, "-sd", str(tmp_path)], cluster.env(**cache_env(demo_assets)), tmp_path)
    assert len(output) == 1 and output[0].startswith(f"error: --ray_dir {tmp_path}: this machine's node"), output
    assert cluster.temp_dirs[0] in output[0] and seconds < 15


def test_two_node_run_places_its_actors_and_survives_a_killed_inferencer(cluster, node_ids, data, demo_assets,
                                                                        tmp_path):
    """The trainers go to the worker node and the inferencer to the head (the start line says so). SIGKILL the
    inferencer's process after step 2: Ray restarts it, it regenerates the round it was on, and the run trains
    every step; each prompt's samples appear exactly G=2 times in the rollout logs."""
    run_dir = tmp_path / "runs" / "kill"
    gate = Gate(tmp_path, run_dir)
    gate.close(after=2)  # a step a round here: step 4's round waits to be scored, the run is on at the kill
    proc = driver(["--master_address", cluster.address, "-d", data[32], "-i", "1", "-t", "2", *SMALL,
                   "-sd", str(tmp_path / "runs"), "-p", "kill", "-rsd", str(tmp_path / "rollouts"), *gate.flags],
                  cluster.env(**cache_env(demo_assets)))
    wait_for(lambda: len(train_steps(run_dir)) >= 2, proc, what="step 2")
    placement = json.load(open(run_dir / "placement.json"))
    assert placement["unit"] == "CPU"
    assert [p["node_id"] for p in placement["inferencers"]] == [node_ids["head"]]
    assert [p["node_id"] for p in placement["trainers"]] == [node_ids["worker"]] * 2
    pid = placement["inferencers"][0]["pid"]
    os.kill(pid, signal.SIGKILL)
    killed_at = len(train_steps(run_dir))
    gate.open()
    out, err = finish(proc)
    assert proc.returncode == 0, err[-3000:]
    assert killed_at < 8, "the run was over before the kill"
    print("inferencer killed after step", killed_at, *[l for l in lines(out + err) if "restarted" in l or "died" in l],
          sep="\n  ")
    assert re.search(r"inferencer 0 restarted on \S+ \(pid \d+\): generating round \d+ again", out + err), out + err
    assert train_steps(run_dir) == list(range(1, 9))
    samples = Counter()
    for name in os.listdir(tmp_path / "rollouts" / "kill"):
        for line in open(tmp_path / "rollouts" / "kill" / name):
            samples[json.loads(line)["prompt"]] += 1
    prompts = Counter(json.dumps(json.loads(line)["messages"]) for line in open(data[32]))
    assert sum(samples.values()) == 32 * 2
    assert sorted(samples.values()) == sorted(2 * count for count in prompts.values())
    head_node, worker_node = (f"{placement[role][0]['ip']} (node {node_ids[name][:8]})"
                              for role, name in (("inferencers", "head"), ("trainers", "worker")))
    assert f"2 nodes: trainer ranks 0-1 on {worker_node}; inferencers 0 on {head_node}" in out
    assert cluster.alive() and len(cluster.nodes()) == 2  # the run left the cluster as it found it


def test_killed_trainer_rank_stops_the_run_and_resume_latest_finishes_it(cluster, data, demo_assets, tmp_path):
    run_dir = tmp_path / "runs" / "rank"
    gate = Gate(tmp_path, run_dir)
    gate.close(after=3)  # a step a round: step 5's waits to be scored, the run is still going at the kill
    argv = ["--master_address", cluster.address, "-d", data[48], "-i", "1", "-t", "2", *SMALL, "-si", "2",
            "-sd", str(tmp_path / "runs"), "-p", "rank", *gate.flags]
    env = cluster.env(**cache_env(demo_assets))
    proc = driver(argv, env)
    wait_for(lambda: os.path.isfile(run_dir / "step_2" / "checkpoint_complete.json")
             and len(train_steps(run_dir)) >= 3, proc, what="the step 2 checkpoint")
    placement = json.load(open(run_dir / "placement.json"))
    pid = placement["trainers"][1]["pid"]
    os.kill(pid, signal.SIGKILL)
    killed = time.time()
    gate.open()
    out, err = finish(proc, timeout=60)
    stopped_in = time.time() - killed
    print(f"trainer rank 1 killed: the run stopped {stopped_in:.1f} s later")
    assert proc.returncode == 1 and stopped_in < 15, err[-3000:]
    print("driver output after the kill:", *lines(err)[-6:], sep="\n  ")
    message = lines(err)[-1]
    newest = max(int(name[5:]) for name in os.listdir(run_dir)
                 if name.startswith("step_") and os.path.isfile(run_dir / name / "checkpoint_complete.json"))
    node = re.escape(f"{placement['trainers'][1]['ip']} (node {placement['trainers'][1]['node_id'][:8]})")
    assert re.fullmatch(rf"error: trainer rank 1 \(pid {pid} on {node}\) died; the run stopped\. Continue "
                        rf"it with --resume \S+/step_{newest} \(the newest complete checkpoint; or --resume latest\)\.",
                        message), message
    done = train_steps(run_dir)
    proc = driver(argv + ["--resume", "latest"], env)
    out, err = finish(proc)
    assert proc.returncode == 0, err[-3000:]
    steps = train_steps(run_dir)
    assert steps == list(range(1, 13)), (done, steps)  # rows after the checkpoint were redone, not repeated
