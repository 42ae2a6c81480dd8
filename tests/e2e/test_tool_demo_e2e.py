"""The tool demo as a user runs it (`rl_example.py --env tool_demo`): GRPO must raise the held-out accuracy and
the tool-use rate of the warm-started model, and the control (`--env tool_demo_off`, whose tool always fails)
must stay near zero accuracy. The demo run trains on the first 256 training rows (8 steps instead of the demo's
16) and evaluates on 128 held-out rows, the control on 64 training rows (2 steps) and 64 held-out rows (its
accuracy has nowhere to come from), to keep the test within a few minutes on 2 cores."""

import json
import os
import re
import subprocess
import sys

import pytest

from tests.run_helpers import ROOT, head


def _run(env_name, assets, tmp_path, rows=256, held_out_rows=128):
    train = head(assets.train_path, tmp_path / f"train{rows}.jsonl", rows)
    held_out = head(assets.eval_path, tmp_path / f"eval{held_out_rows}.jsonl", held_out_rows)
    env = dict(os.environ, COATI_CACHE=os.path.dirname(os.path.dirname(assets.model_dir)))
    proc = subprocess.run([sys.executable, "rl_example.py", "--env", env_name, "-d", train, "-ed",
                           json.dumps({"multiply": held_out}), "--no-progress", "-sd", str(tmp_path / env_name)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    numbers = {}
    for what in ("accuracy", "tool-use rate"):
        for mode in ("sampled", "greedy"):
            found = re.search(rf"held-out {what} multiply/{mode}: ([0-9.]+) -> ([0-9.]+)", proc.stdout)
            assert found, proc.stdout[-2000:]
            numbers[what, mode] = tuple(map(float, found.groups()))
    print(env_name, numbers)
    return numbers


@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_tool_demo_learns_to_call_the_tool_and_the_control_does_not(tool_demo_assets, tmp_path):
    tool = _run("tool_demo", tool_demo_assets, tmp_path)
    before, after = tool["accuracy", "greedy"]
    assert after - before >= 0.5, f"greedy accuracy {before} -> {after}"
    before, after = tool["accuracy", "sampled"]
    assert after - before >= 0.2, f"sampled accuracy {before} -> {after}"
    before, after = tool["tool-use rate", "sampled"]
    assert after - before >= 0.3, f"sampled tool-use rate {before} -> {after}"
    # 2 steps (a weight version published and loaded): its accuracy has nowhere to come from however long it trains
    control = _run("tool_demo_off", tool_demo_assets, tmp_path, rows=64, held_out_rows=64)
    assert max(control["accuracy", "sampled"] + control["accuracy", "greedy"]) <= 0.05, control
