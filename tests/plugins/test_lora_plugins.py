"""LoRA on the multi-rank plugins that train adapters: ColossalAI's TorchDDP and LowLevelZero against torch DDP.

One 2-rank gloo group (``tests.plugins.lora_check``) puts the same adapters on the tiny Qwen2 under each layout,
trains two steps (lr 1e-2) and records what ``test_lora.py`` asks of the single plugin: the adapted model
starts as the base, only adapters train and hold optimizer state, the version is the adapters by peft name,
the frozen base stays put, ``adapters_off`` computes the base, merged weights compute the trained model, the
saved directory is a PEFT adapter, and a resume from the state after step 1 repeats step 2.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch
from plugin_group import run_ranks

FP32 = ["torch-ddp", "colossalai-ddp", "colossalai-zero:zero=2"]
BF16 = "colossalai-zero:zero=1:precision=bf16"
CROSS = "colossalai-ddp@torch-ddp"  # TorchDDPPlugin reads the torch layouts' DCP trainer state (fp32)
ADAPTER_TENSORS = 2 * 7 * 2  # A and B of every linear projection of the 2 decoder blocks
ADAPTER_NUMEL = 22528  # rank 4 on the tiny Qwen2's projections (peft's count)
has_colossalai = importlib.util.find_spec("colossalai") is not None
pytestmark = pytest.mark.skipif(not has_colossalai, reason="colossalai is not installed")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("lora_plugins"))
    run_ranks("tests.plugins.lora_check", ["--layouts", ",".join(FP32 + [BF16]), "--cross", CROSS, "--out", out], 2,
              out, timeout_s=240)
    found = {layout: torch.load(os.path.join(out, layout.replace(":", "_") + ".pt"), weights_only=False)
             for layout in FP32 + [BF16]}
    found[CROSS] = torch.load(os.path.join(out, f"cross_{CROSS}.pt"), weights_only=False)
    return found


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[n].float() - b[n].float()).abs().max()) for n in a)


@pytest.mark.e2e
@pytest.mark.parametrize("layout", FP32)
def test_adapters_alone_train_from_the_base_and_resume_exactly(runs, layout):
    found = runs[layout]
    assert found["init_diff"] == 0.0  # B = 0: the adapted model is the base
    adapters = sorted(found["version"])
    assert len(adapters) == ADAPTER_TENSORS and all(".lora_A.default." in n or ".lora_B.default." in n
                                                    for n in adapters)
    assert all(n.startswith("base_model.model.model.layers.") for n in adapters)  # peft's names, as engines have
    assert found["optimised"] == adapters
    assert found["master_dtypes"] == ["torch.float32"]
    # ZeRO partitions the adapters' masters and states over the 2 ranks; DDP keeps them whole
    expected = ADAPTER_NUMEL // 2 if "zero" in layout else ADAPTER_NUMEL
    assert found["master_numel"] == expected
    assert found["with_grad"] in ([], adapters)  # ZeRO moves gradients into its own buckets
    assert found["frozen_moved"] == 0.0
    assert found["on_diff"] > 0.1 and found["off_diff"] == 0.0  # the adapters changed it; off, it is the base
    assert found["merged_diff"] < 1e-5 and found["saved_diff"] < 1e-6
    assert found["resumed_diff"] <= 1e-6
    if "colossalai" in layout:  # the trainer state keeps the adapters alone (a PEFT directory), not the base
        files = found["state_files"]
        assert "adapter_model.safetensors" in files and not any(f.startswith(("pytorch_model", "model")) for f in files)


@pytest.mark.e2e
@pytest.mark.parametrize("layout", FP32[1:])
def test_colossalai_trains_the_adapters_as_torch_ddp_does(runs, layout):
    reference, found = runs["torch-ddp"], runs[layout]
    logprobs = float((found["logprobs"] - reference["logprobs"]).abs().max())
    version = _max_diff(found["version"], reference["version"])
    print(f"{layout} against torch-ddp after 2 steps: |dlogprob| {logprobs:.1e}  max|dw| {version:.1e}")
    assert logprobs <= 1e-5
    # the adapters' gradients, averaged over the ranks as torch DDP does (Adam alone would hide a scale)
    assert found["grad_norms"] == pytest.approx(reference["grad_norms"], rel=1e-5)
    # Adam's first steps on the lora_A elements with near-zero gradients amplify summation-order noise: a
    # tenth of one step (lr) still tells a missed or different update
    assert version < 1e-3


@pytest.mark.e2e
def test_colossalai_ddp_resumes_a_torch_ddp_lora_state(runs):
    assert _max_diff(runs[CROSS], runs["torch-ddp"]["version"]) <= 1e-6


@pytest.mark.e2e
def test_bf16_zero_keeps_fp32_masters_of_the_adapters_only(runs):
    found, reference = runs[BF16], runs["torch-ddp"]
    assert found["optimised"] == sorted(reference["version"])
    assert found["master_dtypes"] == ["torch.float32"] and found["master_numel"] == ADAPTER_NUMEL // 2
    assert found["frozen_moved"] == 0.0
    assert {str(t.dtype) for t in found["version"].values()} == {"torch.bfloat16"}  # the working copies
    # bf16 compute: the base within bf16 rounding at start and with adapters off; merged weights (bf16 base)
    # and the saved adapter compute the trained model; training follows torch DDP's
    assert found["init_diff"] < 2e-2 and found["off_diff"] < 2e-2
    assert found["merged_diff"] < 2e-2 and found["saved_diff"] < 2e-2
    logprobs = float((found["logprobs"] - reference["logprobs"]).abs().max())
    print(f"{BF16} against torch-ddp (fp32) after 2 steps: |dlogprob| {logprobs:.1e}; "
          f"the steps moved {found['on_diff']:.2f}")
    assert logprobs < 5e-2 < found["on_diff"]


def test_a_colossalai_state_resumes_only_with_or_without_adapters_as_saved():
    from coati.plugins.colossal import colossal_mismatch
    from coati.plugins.state import layout_manifest

    manifest = {"format": "colossalai", **layout_manifest("colossalai-zero", 2, zero_stage=2)}
    lora, full = {**manifest, "adapters": True}, {**manifest, "adapters": False}
    assert colossal_mismatch(lora, lora) is None and colossal_mismatch(full, full) is None
    assert colossal_mismatch(manifest, full) is None  # written before adapters were recorded: full weights
    for saved, requested in ((lora, full), (full, lora), (manifest, lora)):
        assert colossal_mismatch(saved, requested) == "one holds LoRA adapters (--lora-rank), the other full weights"


def test_a_state_whose_plugin_ties_its_head_once_resumes_only_on_that_plugin_without_pipeline():
    # the rule is the writer's row (ties_head_once_without_pp), not its name: colossalai-hybrid's row says it
    from coati.plugins.colossal import colossal_mismatch
    from coati.plugins.state import layout_manifest

    def state(plugin, **sizes):
        return {"format": "colossalai", "adapters": False, **layout_manifest(plugin, 2, **sizes)}

    hybrid_tp, hybrid_pp, zero = state("colossalai-hybrid", tp_size=2), state("colossalai-hybrid", pp_size=2), \
        state("colossalai-zero", zero_stage=1)
    assert colossal_mismatch(hybrid_tp, hybrid_tp) is None
    assert colossal_mismatch(hybrid_pp, zero) is None and colossal_mismatch(zero, hybrid_pp) is None
    for requested in (zero, hybrid_pp):
        assert colossal_mismatch(hybrid_tp, requested) == (
            "a colossalai-hybrid checkpoint without pipeline stores tied embeddings once (no lm_head.weight); "
            "only colossalai-hybrid with pp_size 1 reads it")
