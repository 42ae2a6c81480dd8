"""Each ColossalAI CPU fix: the upstream symptom shows without it and is gone with it.

The checks run in a fresh interpreter (the fixes patch classes process-wide), before and after
``colossal_cpu_compat.apply()``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("colossalai")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PROBE = r'''
import json, sys, types, warnings
warnings.filterwarnings("ignore")
import torch
import torch.distributed as dist
from colossalai.accelerator import get_accelerator
from colossalai.zero.low_level.low_level_optim import LowLevelZeroOptimizer
from coati.plugins import colossal_cpu_compat

acc = get_accelerator()

def zero_check(dtype):
    param = torch.nn.Parameter(torch.zeros(2, dtype=dtype))
    fake = types.SimpleNamespace(optim=types.SimpleNamespace(param_groups=[{"params": [param]}]), _dtype=torch.float32)
    LowLevelZeroOptimizer._sanity_checks(fake)

def streams():
    stream = acc.Stream()
    stream.wait_stream(acc.current_stream())
    with acc.stream(stream):
        pass
    acc.synchronize()

def rng():
    state = acc.get_rng_state()
    acc.manual_seed(3)
    first = torch.rand(1)
    acc.set_rng_state(state)
    acc.manual_seed(3)
    assert torch.equal(first, torch.rand(1))

PROBES = {
    "rng_state": rng,
    "streams": streams,
    "hccl_available": lambda: dist.is_hccl_available() is False or (_ for _ in ()).throw(AssertionError("True")),
    "current_device": lambda: torch.zeros(1).device.index == acc.current_device() or (_ for _ in ()).throw(AssertionError),
    "zero_device_check": lambda: zero_check(torch.float32),
}

def run():
    out = {}
    for name, probe in PROBES.items():
        try:
            probe()
            out[name] = "ok"
        except BaseException as err:
            out[name] = f"{type(err).__name__}: {err}"
    return out

before = run()
applied = colossal_cpu_compat.apply()
after = run()
try:
    zero_check(torch.bfloat16)
    dtype_check = "not raised"
except AssertionError as err:
    dtype_check = str(err)
print(json.dumps({"accelerator": acc.name, "before": before, "after": after, "applied": applied,
                  "dtype_check": dtype_check, "idempotent": colossal_cpu_compat.apply() == applied}))
'''


@pytest.fixture(scope="module")
def probe():
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=180,
                          env=dict(os.environ, PYTHONPATH=REPO))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_compat_only_on_cpu_accelerator(probe):
    if probe["accelerator"] != "cpu":
        pytest.skip("ColossalAI picked a GPU accelerator: the CPU fixes are not applied")
    from coati.plugins.colossal_cpu_compat import FIXES

    assert probe["applied"] == [fix.name for fix in FIXES]
    assert probe["idempotent"]


SYMPTOMS = {
    "rng_state": "get_rng_state() takes 0 positional arguments",
    "streams": "not supported for cpu accelerator",
    "hccl_available": "has no attribute 'is_hccl_available'",
    "current_device": "not supported for cpu accelerator",
    "zero_device_check": "device is required",
}


@pytest.mark.parametrize("fix", sorted(SYMPTOMS))
def test_fix_removes_upstream_symptom(probe, fix):
    if probe["accelerator"] != "cpu":
        pytest.skip("GPU accelerator")
    before = probe["before"][fix]
    if before == "ok":  # upstream fixed it (newer ColossalAI/torch): the fix is then harmless
        pytest.skip(f"{fix}: the upstream symptom no longer shows")
    assert SYMPTOMS[fix] in before, before
    assert probe["after"][fix] == "ok", probe["after"][fix]


def test_zero_fix_keeps_dtype_check(probe):
    if probe["accelerator"] != "cpu":
        pytest.skip("GPU accelerator")
    assert "expected to have the same dtype" in probe["dtype_check"]
