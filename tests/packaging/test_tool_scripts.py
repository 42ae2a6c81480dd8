"""The developer tools' input checks: a bad value is refused in one line, before any work starts."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.run_helpers import ROOT


@pytest.mark.parametrize("stages", ["9", "1 x", "1+1", "0"])
def test_gpu_check_refuses_an_unknown_stage_before_probing_the_gpu(stages):
    # PY=false: any probe of the interpreter would fail differently, so the refusal must come first
    result = subprocess.run(["bash", "scripts/gpu_check.sh", "/nonexistent/out"], cwd=ROOT, capture_output=True,
                            text=True, timeout=30, env={"PATH": "/usr/bin:/bin", "PY": "false", "STAGES": stages})
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"gpu_check: no stage {stages.split()[-1]} in STAGES (stages: 1 2 3 4 5)"]


@pytest.mark.parametrize("value", ["0", "-0.5", "1.5"])
def test_bench_trainer_memory_refuses_a_slice_outside_the_logits(value):
    result = subprocess.run([sys.executable, "benchmarks/bench_trainer_memory.py", "--entropy-slice", value],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].endswith(
        f"--entropy-slice {float(value):g}: a fraction of the logits, in (0, 1]")
