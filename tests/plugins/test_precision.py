"""Every plugin x precision: the dtype the forward really computed in (forward hooks on the linear layers), fp32
master weights, and a step close to the fp32 single-process one; gradient checkpointing changes no number.

CPU, gloo, the tiny Qwen2 and the GRPO step of tests/plugins/equivalence.py (2-rank layouts through the same
group runner). bf16 tolerance: the step moves weights by ~lr = 1e-4 and bf16 rounds the gradients' direction,
so weights stay within 2e-3 of the fp32 step (as for ColossalAI's bf16 in test_equivalence.py).
"""

from __future__ import annotations

import importlib.util

import pytest
from plugin_group import run_group
from test_equivalence import TOL, check

from coati.plugins import make_plugin
from coati.parallel.dims import ParallelDims
from coati.plugins.validation import validate_layout
from coati.registry.plugins import PLUGINS

BF16, FP32 = ["torch.bfloat16"], ["torch.float32"]
TORCH_BF16 = ["torch-ddp:precision=bf16", "torch-fsdp2:precision=bf16", "torch-fsdp2:zero=3:precision=bf16",
              "torch-tp:tp=2:precision=bf16", "torch-pp:pp=2:precision=bf16"]
TORCH_CHECKPOINTED = ["torch-ddp:gc=1", "torch-fsdp2:gc=1", "torch-tp:tp=2:gc=1", "torch-pp:pp=2:gc=1"]
TORCH_PLUGINS = tuple(name for name, spec in PLUGINS.items() if spec.family == "torch")
has_colossalai = importlib.util.find_spec("colossalai") is not None


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The fp32 single-process step, and the single plugin in bf16 and with gradient checkpointing."""
    layouts = ["single", "single:precision=bf16", "single:gc=1"]
    return run_group(layouts, 1, str(tmp_path_factory.mktemp("single")), timeout_s=120)


COLOSSAL_BF16 = {"colossalai-ddp:precision=bf16": BF16, "colossalai-zero:zero=2:precision=bf16": BF16,
                 "colossalai-hybrid:tp=2:precision=bf16": BF16}


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """Every two-rank layout below in one group of processes: a group's start (torch's and ColossalAI's imports)
    costs more than its steps; torch-native and ColossalAI layouts mix in one group as in test_equivalence.py."""
    layouts = TORCH_BF16 + TORCH_CHECKPOINTED + (list(COLOSSAL_BF16) if has_colossalai else [])
    return run_group(layouts, 2, str(tmp_path_factory.mktemp("two_ranks")), timeout_s=480)


def assert_precision(results: dict, forward: list[str]) -> None:
    for layout, result in results.items():
        assert result["forward_dtypes"] == forward, f"{layout}: the forward ran in {result['forward_dtypes']}"
        assert result["master_dtypes"] == FP32, f"{layout}: the optimizer updates {result['master_dtypes']} weights"


def test_single_plugin_computes_in_its_precision(reference):
    assert_precision({"single": reference["single"]}, FP32)
    assert_precision({"single:precision=bf16": reference["single:precision=bf16"]}, BF16)
    check({"single:precision=bf16": reference["single:precision=bf16"]}, reference["single"], tol=2e-3)
    check({"single:gc=1": reference["single:gc=1"]}, reference["single"])


@pytest.mark.e2e
def test_torch_plugins_compute_in_bf16_with_fp32_masters_and_checkpoint_exactly(reference, two_ranks):
    results = two_ranks
    bf16 = {layout: results[layout] for layout in TORCH_BF16}
    assert_precision(bf16, BF16)
    check(bf16, reference["single"], tol=2e-3)
    checkpointed = {layout: results[layout] for layout in TORCH_CHECKPOINTED}
    assert_precision(checkpointed, FP32)
    check(checkpointed, reference["single"], tol=TOL)


@pytest.mark.parametrize("plugin", TORCH_PLUGINS + ("colossalai-ddp",))
def test_plugins_without_a_loss_scaler_refuse_fp16_in_one_line(plugin):
    world = 1 if plugin == "single" else 2
    layout = ParallelDims(world, tp_size=2 if plugin == "torch-tp" else 1, pp_size=2 if plugin == "torch-pp" else 1,
                          precision="fp16")
    with pytest.raises(ValueError, match="fp16 needs a loss scaler") as err:
        validate_layout(plugin, layout)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="fp16 needs a loss scaler"):
        make_plugin("single", precision="fp16").setup(None, 1e-4)


@pytest.mark.e2e
@pytest.mark.skipif(not has_colossalai, reason="colossalai is not installed (scripts/install_colossalai.sh)")
def test_colossalai_plugins_compute_in_their_precision(reference, two_ranks):
    # (fp16 is not here: ColossalAI 0.5.0's loss scaler asks the CPU accelerator for a device count and fails)
    results = {layout: two_ranks[layout] for layout in COLOSSAL_BF16}
    for layout, forward in COLOSSAL_BF16.items():
        assert_precision({layout: results[layout]}, forward)
    check(results, reference["single"], tol=2e-3)
