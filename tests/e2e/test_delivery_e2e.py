"""The weight-delivery check on real runs whose engines do not get a version as trained (faults injected into
every Ray worker: delivery_faults.py): the first step trained on the new version's rows stops the run, after a
checkpoint, with one line naming the version. Engines that keep their old weights, a transport that loses one
tensor, and one that loses a LoRA version's adapters, on one module cluster. The healthy run's side:
tests/e2e/test_eval_and_rollout_logs.py."""

from __future__ import annotations

import json
import os

import pytest
import ray

from coati.cluster.supervision import RunStopped
from coati.config.cli import build_parser, config_from_args
from coati.launcher.preflight import check_inputs
from coati.utils.checkpoint import list_checkpoints
from delivery_faults import FAULT_FILE
from run_helpers import MODULE_RAY_CPUS, head, run_in_module_ray

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
LORA = ["--lora-rank", "4", "--lora-alpha", "8", "-lr", "3e-3"]


@pytest.fixture(scope="module")
def fault_file(tmp_path_factory):
    """A cluster whose every worker has the faults installed; the file says which one acts (none while empty)."""
    path = tmp_path_factory.mktemp("fault") / "fault.txt"
    path.write_text("")
    python_path = os.pathsep.join(p for p in (HERE, ROOT, os.environ.get("PYTHONPATH")) if p)
    ray.init(address="local", num_cpus=MODULE_RAY_CPUS, include_dashboard=False, logging_level="ERROR",
             log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": python_path, FAULT_FILE: str(path)},
                                               "worker_process_setup_hook": "delivery_faults.install"})
    return path


@pytest.mark.e2e
@pytest.mark.timeout(300)
@pytest.mark.parametrize("fault, flags", [("stale", []), ("drop_tensor", []), ("drop_adapters", LORA)],
                         ids=["engines keep old weights", "a tensor lost", "LoRA adapters lost"])
def test_an_undelivered_version_stops_the_run_at_its_first_step(demo_assets, fault_file, tmp_path, fault, flags):
    fault_file.write_text(fault)
    train = head(demo_assets.train_path, tmp_path / "train.jsonl", 32)
    argv = ["-d", train, "-ibs", "8", "-imbs", "8", "-g", "4", "-tbs", "4", "-tMbs", "4", "-tmbs", "8", "-e", "1",
            "-b", "transformers", "-sd", str(tmp_path / "runs"), "-p", "stale", "--no-progress", *flags]
    config = config_from_args(build_parser().parse_args(argv), demo_assets)
    check_inputs(config)
    with pytest.raises(RunStopped) as stopped:
        run_in_module_ray(config)
    line = str(stopped.value)
    print(line)
    # rounds of 8 prompts, 2 steps each: v1 is published after step 2 and its rows are first trained at step 3
    assert "\n" not in line and line.startswith("step 3: weights v1 did not reach the engines as trained"), line
    assert "(bound 0.001 in fp32)" in line and "--weight-sync object-store" in line, line
    run_dir = tmp_path / "runs" / "stale"
    assert line.endswith(f"the run stopped after saving {run_dir / 'step_3'}"), line
    assert [step for step, _ in list_checkpoints(str(run_dir))] == [3]
    rows = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    gaps = {r["step"]: r.get("delivery_gap") for r in rows if r["kind"] == "train"}
    assert sorted(gaps) == [1, 2, 3] and gaps[2] is None  # step 2: the weights had moved on, nothing to check
    assert gaps[1] < 1e-4 < 1e-3 < gaps[3], gaps  # v0 was delivered (the engines' start); v1 was not
