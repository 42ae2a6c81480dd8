"""The weight-delivery check on a real run whose engines never load the published weights (a fault injected into
every Ray worker: delivery_faults.py): the first step trained on a new version's rows stops the run, after a
checkpoint, with one line naming the version. The healthy run's side: tests/e2e/test_grpo_e2e.py."""

from __future__ import annotations

import json
import os

import pytest
import ray

from coati.cluster.supervision import RunStopped
from coati.config.cli import build_parser, config_from_args
from coati.launcher.preflight import check_inputs
from coati.utils.checkpoint import list_checkpoints
from run_helpers import MODULE_RAY_CPUS, head, run_in_module_ray

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_engines_that_keep_old_weights_stop_the_run_at_the_versions_first_step(demo_assets, tmp_path):
    path = os.pathsep.join(p for p in (HERE, ROOT, os.environ.get("PYTHONPATH")) if p)
    ray.init(address="local", num_cpus=MODULE_RAY_CPUS, include_dashboard=False, logging_level="ERROR",
             log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": path},
                                               "worker_process_setup_hook": "delivery_faults.engines_keep_old_weights"})
    train = head(demo_assets.train_path, tmp_path / "train.jsonl", 32)
    argv = ["-d", train, "-ibs", "8", "-imbs", "8", "-g", "4", "-tbs", "4", "-tMbs", "4", "-tmbs", "8", "-e", "1",
            "-sd", str(tmp_path / "runs"), "-p", "stale", "--no-progress"]
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
