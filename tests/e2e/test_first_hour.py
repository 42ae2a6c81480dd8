"""A user's first hour in one short run: the demo model as a hub name from an offline Hugging Face cache
(HF_HUB_OFFLINE=1, HF_HOME in tmp_path), trained through the Python API (``coati.run``), then continued with
``coati train --resume latest`` and one flag given again: the checkpoint's saved options make up the rest.

Child processes, since huggingface_hub reads HF_HOME and HF_HUB_OFFLINE when it is imported. 16 prompts, -ibs 8
x -g 2, 8 groups a step: 2 steps an episode. The transformers engine (``backend``, saved with the run's options):
a user's model would get vLLM, whose start costs each of the four engines here more than the run's training, and
the engine choice has tests of its own (tests/config/test_engine_choice.py, tests/rollout/test_vllm_backend.py).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.ray_nodes import clean_env
from tests.run_helpers import ROOT, fill_hub_cache, head

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

API_RUN = """
import json, sys
import coati

summary = coati.run(model="coati-test/adder", dataset=sys.argv[1], save_dir=sys.argv[2], reward_type="boxed",
                    backend="transformers", system_prompt="", learning_rate=3e-4, max_new_tokens=8, max_prompt_tokens=64,
                    inference_batch_size=8, inference_microbatch_size=8, num_generations=2, train_batch_size=8,
                    train_minibatch_size=8, train_microbatch_size=16, progress=False, log=lambda line: None)
print(json.dumps({"steps": summary.steps, "checkpoint": summary.checkpoint, "final": summary.final_metrics}))
"""


def test_hub_name_through_the_python_api_then_resume_with_one_flag_changed(demo_assets, tmp_path):
    snapshot = fill_hub_cache(tmp_path / "hf", "coati-test/adder", demo_assets.model_dir)
    env = clean_env(HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1")
    data, runs = head(demo_assets.train_path, tmp_path / "train.jsonl", 16), tmp_path / "runs"

    first = subprocess.run([sys.executable, "-c", API_RUN, data, str(runs)], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    summary = json.loads(first.stdout.strip().splitlines()[-1])
    run_dir = runs / "adder"  # -p defaults to the model's name
    assert summary["steps"] == 2 and summary["checkpoint"] == str(run_dir / "step_2")
    assert {"loss", "reward", "accuracy"} <= set(summary["final"])
    saved = json.loads((run_dir / "step_2" / "run_state.json").read_text())["options"]
    assert saved["model"] == snapshot and saved["inference_batch_size"] == 8

    resumed = subprocess.run([sys.executable, "-m", "coati", "train", "--resume", "latest", "-sd", str(runs), "-p",
                              "adder", "-e", "2", "--no-progress"], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    lines = resumed.stdout.splitlines()
    # the first run left -e at its default (1 for a user's model)
    listed = f"--resume {run_dir / 'step_2'}: the run's saved options; given again: --num-episodes default -> 2"
    assert listed in lines, lines
    assert any(line.startswith("trained 4 steps in ") and line.endswith(str(run_dir / "step_4")) for line in lines)
