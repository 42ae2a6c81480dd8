"""The code demo as a user runs it (`rl_example.py -rt code`), stopped at half its 48 steps (`--max-steps 24`):
GRPO with the sandboxed code reward must raise the held-out sampled pass rate of the warm-started model by at
least 15 points (the issue's bar), without losing more than 10 points of its greedy pass rate.

Measured (docs/results.md): this command, sampled 0.250 -> 0.417 (+16.7) and greedy 0.969 -> 0.917 (-5.2); with
`-ei 12`, whose extra evaluation draws other samples, +35.4 after 24 steps; +51 after all 48. One sampled
evaluation of 96 specs moves by about 5 points with its samples, so this margin is thin: a change to the
sampling streams can fail it without any loss of learning."""

import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_code_demo_cli_learns(code_demo_assets, tmp_path):
    env = dict(os.environ, COATI_CACHE=os.path.dirname(os.path.dirname(code_demo_assets.model_dir)))
    proc = subprocess.run([sys.executable, "rl_example.py", "-rt", "code", "--no-progress", "--max-steps", "24",
                           "-sd", str(tmp_path / "runs")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=860)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sampled = re.search(r"held-out accuracy code/sampled: ([0-9.]+) -> ([0-9.]+)", proc.stdout)
    greedy = re.search(r"held-out accuracy code/greedy: ([0-9.]+) -> ([0-9.]+)", proc.stdout)
    assert sampled and greedy, proc.stdout[-2000:]
    before, after = map(float, sampled.groups())
    assert after - before >= 0.15, f"sampled pass rate {before} -> {after}"
    assert float(greedy.group(2)) >= float(greedy.group(1)) - 0.1, greedy.group(0)
    # sandboxed scoring in the producers, a weight version published per round, and the verdicts' reasons logged
    run_dir = tmp_path / "runs" / "demo"
    rows = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    versions = [r["weight_version"] for r in rows if r["kind"] == "train"]
    assert len(versions) == 24 and versions == sorted(versions) and versions[-1] == 12, versions
    records = [json.loads(line) for line in open(run_dir / "eval" / "code_greedy_step24.jsonl")]
    assert len(records) == 96 and all(r["reason"] for r in records)
