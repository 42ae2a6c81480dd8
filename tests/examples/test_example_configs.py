"""Every shipped example config loads through the real config path and passes validation.

Paths in the examples (models, data) name the user's files: the settings are checked, not the files, which
the commands check at start-up (launcher/preflight.py). The demos' configs get the demo's asset paths, as the
commands give them."""

from __future__ import annotations

import glob
import os

import pytest
import yaml

from coati.config.cli import build_parser, config_from_args
from coati.demo.assets import DemoAssets
from coati.rlhf.pipeline import ppo_config, read_plan, stage_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = sorted(glob.glob(os.path.join(ROOT, "examples", "configs", "*.yaml")))
PIPELINES = [path for path in EXAMPLES if "stages" in (yaml.safe_load(open(path)) or {})]
RUNS = [path for path in EXAMPLES if path not in PIPELINES]
DEMO = DemoAssets(model_dir="/demo/model", train_path="/demo/train.jsonl", eval_path="/demo/eval.jsonl", report={})


def test_the_examples_cover_the_common_layouts():
    names = {os.path.basename(path) for path in EXAMPLES}
    assert {"demo.yaml", "code_demo.yaml", "gsm8k_2gpu.yaml", "multinode_2x8.yaml", "seed_4x8.yaml",
            "rlhf_own_data.yaml"} <= names


@pytest.mark.parametrize("path", RUNS, ids=os.path.basename)
def test_run_config_validates(path):
    embedded = "demo" in os.path.basename(path)
    parser = build_parser()
    argv = ["--config", path] + ([] if embedded else ["-m", "/user/model", "-d", "/user/train.parquet"])
    args = parser.parse_args(argv)
    config = config_from_args(args, DEMO if embedded else None, parser.given)
    raw = yaml.safe_load(open(path))
    assert config.parallel.num_trainers == raw.get("num_trainers", 1)
    assert config.algo.name == raw.get("algo", "GRPO")
    if "tensor_parallel_size" in raw:  # the layout is the one the file describes
        p = config.parallel
        assert (p.tensor_parallel_size, p.pipeline_parallel_size) == (raw["tensor_parallel_size"],
                                                                      raw["pipeline_parallel_size"])


@pytest.mark.parametrize("path", PIPELINES, ids=os.path.basename)
def test_pipeline_config_validates(path):
    plan = read_plan(path)
    for stage in plan.stages:
        config = ppo_config(plan, check_files=False) if stage == "ppo" else stage_config(plan, stage)
        assert config is not None
    assert stage_config(plan, "sft").model == plan.model  # the top-level model starts the first stage
