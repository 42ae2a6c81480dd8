"""The CPU-sized example configs are the demos, setting for setting, so the demos' end-to-end runs
(tests/e2e/test_grpo_e2e.py, tests/e2e/test_code_demo_e2e.py) are runs of these files too."""

from __future__ import annotations

import dataclasses
import os

import pytest

from coati.config.cli import build_parser, config_from_args
from coati.demo.assets import DemoAssets

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEMO = DemoAssets(model_dir="/demo/model", train_path="/demo/train.jsonl", eval_path="/demo/eval.jsonl", report={})


def config(argv: list[str]):
    parser = build_parser()
    args = parser.parse_args(argv)
    assert args.model is None  # no model: the command builds the embedded demo's assets, as with these flags
    return config_from_args(args, DEMO, parser.given)


@pytest.mark.parametrize("name,demo_flags", [("demo.yaml", []), ("code_demo.yaml", ["-rt", "code", "-p", "code-demo"])])
def test_example_config_is_the_demo(name, demo_flags):
    from_file = config(["--config", os.path.join(ROOT, "examples", "configs", name)])
    from_flags = config(demo_flags)
    # (fields out of comparison, RLConfig.options, record how the values were given, not the run)
    differ = [f.name for f in dataclasses.fields(from_file)
              if f.compare and getattr(from_file, f.name) != getattr(from_flags, f.name)]
    assert not differ, f"{name} differs from the demo in {differ}"
