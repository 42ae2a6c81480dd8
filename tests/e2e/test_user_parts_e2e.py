"""A user's own policy loss trains in the trainer's Ray actors, as docs/algorithms.md shows it: registered in a
script's ``__main__`` and run through ``coati.run`` (no flag: the row travels by value), and from a file with
``coati train --plugins`` (with an advantage estimator of the same file, in the trainer ranks, and an environment,
in the producers' and the evaluator's episodes). The loss adds a statistic of its own,
``my_clip_tokens``: it reaches metrics.jsonl only from the trainer ranks' calls of that function.

Both runs: the demo's tiny model, 8 prompts x 2 samples a step, 4 steps; the second evaluates 16 held-out prompts.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.ray_nodes import clean_env
from tests.run_helpers import ROOT, head, run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

SMALL = {"backend": "transformers", "system_prompt": "", "learning_rate": 3e-4, "max_new_tokens": 8,
         "max_prompt_tokens": 64, "inference_batch_size": 8, "inference_microbatch_size": 8, "num_generations": 2,
         "train_batch_size": 8, "train_minibatch_size": 8, "train_microbatch_size": 16, "progress": False}


def docs_python_run() -> str:
    """docs/algorithms.md's Python example that calls coati.run."""
    with open(os.path.join(ROOT, "docs", "algorithms.md")) as handle:
        blocks = re.findall(r"```python\n(.*?)```", handle.read(), re.DOTALL)
    found = [block for block in blocks if "coati.run(" in block]
    assert len(found) == 1, found
    return found[0]


def trained_rows(metrics_path) -> list[dict]:
    return [row for row in map(json.loads, open(metrics_path)) if row.get("kind") == "train"]


def test_a_scripts_own_policy_loss_trains_through_coati_run(demo_assets, tmp_path):
    runs, data = tmp_path / "runs", head(demo_assets.train_path, tmp_path / "train.jsonl", 64)
    # no held-out set: no evaluator actor (the command-line test below has one)
    options = {**SMALL, "model": demo_assets.model_dir, "dataset": data, "save_dir": str(runs), "project": "mine",
               "log": None}
    # the docs' script as written, with this test's small run's options added to its call
    script = docs_python_run().replace("coati.run(", "coati.run(**OPTIONS, ")
    (tmp_path / "my_run.py").write_text(
        f"import json\nOPTIONS = json.loads({json.dumps(json.dumps(options))})\nOPTIONS['log'] = lambda line: None\n"
        + script)
    done = subprocess.run([sys.executable, str(tmp_path / "my_run.py")], cwd=tmp_path, env=clean_env(),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = trained_rows(runs / "mine" / "metrics.jsonl")
    assert len(rows) == 4 and all(row["my_clip_tokens"] > 0 for row in rows), rows
    assert float(done.stdout.strip().splitlines()[-1]) == rows[-1]["my_clip_tokens"]


def test_a_plugin_file_through_the_command_line(demo_assets, tmp_path, registries_restored):
    argv = ["--plugins", os.path.join(ROOT, "examples", "parts", "my_parts.py"),
            "--grpo-config", '{"objective": "my_clip", "advantage": "centred"}', "--env", "boxed_once",
            "--max-steps", "4",
            "-sd", str(tmp_path / "runs"), "-ed", json.dumps({"addition": head(demo_assets.eval_path,
                                                                               tmp_path / "eval.jsonl", 16)})]
    for key, value in SMALL.items():
        if key != "progress":
            argv += [f"--{key.replace('_', '-')}", str(value)]
    result, rows = run_cli(argv + ["--no-progress"], demo_assets)
    trained = [row for row in rows if row.get("kind") == "train"]
    assert result.steps == 4 and len(trained) == 4 and all(row["my_clip_tokens"] > 0 for row in trained)
    evals = [row for row in rows if row.get("kind") == "eval"]
    assert {row["step"] for row in evals} == {0, 4}, evals  # the evaluator ran the plugin's episodes
