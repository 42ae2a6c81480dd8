"""Trainer-state checkpoints: ``save_state`` after step 1, ``load_state`` in a fresh process group, step 2 equal.

Each layout (tiny Qwen2 with tied embeddings, fp32, AdamW lr 1e-4, clipping at 1.0, GRPO batches A then B)
trains step 1, saves, trains step 2: the uninterrupted run. A new set of processes builds the layout again
from the initial model, loads, and trains step 2: its loss and weights after the step must equal the
uninterrupted run's (1e-6 in the same layout; 1e-5 across layouts, where reduction orders differ). The weights
right after loading must equal the step-1 weights. (Step 2's loss only checks the parameters; the weights after
step 2 check the AdamW moments and step counts too: a fresh AdamW there moves weights 1.7e-4 further.)

Driver: ``tests.plugins.state_check``, launched through ``plugin_group.run_ranks``; cases are grouped into few
launches (imports dominate), so the file runs in about 100 s on 2 CPU cores (40 s of it the 4-rank e2e test).
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import shutil

import pytest
import torch
from plugin_group import max_abs_diff, run_ranks

SAME_TOL, CROSS_TOL = 1e-6, 1e-5
TORCH_LAYOUTS = ["torch-ddp", "torch-fsdp2", "torch-tp:tp=2", "torch-pp:pp=2"]
# (layout that loads, layout that saved): DCP reshards between all of them
TORCH_CROSS = [("torch-fsdp2", "single"), ("torch-pp:pp=2", "single"), ("torch-tp:tp=2", "torch-fsdp2"),
               ("torch-ddp", "torch-pp:pp=2")]
SINGLE_CROSS = [("single", "torch-fsdp2"), ("single", "torch-ddp"), ("single", "torch-tp:tp=2"),
                ("single", "torch-pp:pp=2")]
COLOSSAL_LAYOUTS = ["colossalai-ddp", "colossalai-zero:zero=2", "colossalai-hybrid:tp=2", "colossalai-hybrid:pp=2"]
COLOSSAL_CROSS = [("colossalai-zero:zero=2", "colossalai-ddp"), ("colossalai-hybrid:tp=2", "colossalai-zero:zero=2"),
                  ("colossalai-hybrid:pp=2", "colossalai-ddp"), ("colossalai-hybrid:tp=2", "colossalai-hybrid:pp=2"),
                  ("colossalai-ddp", "single")]  # the last one: colossalai-ddp reads torch-dcp checkpoints
COLOSSAL_REFUSED = [("colossalai-zero:zero=2", "colossalai-hybrid:tp=2"),
                    ("colossalai-hybrid:pp=2", "colossalai-hybrid:tp=2"),  # would silently keep the initial head
                    ("colossalai-zero:zero=2", "single"), ("torch-fsdp2", "colossalai-ddp")]
has_colossalai = importlib.util.find_spec("colossalai") is not None


def name(layout: str) -> str:
    return layout.replace(":", "_")


def launch(out: str, world_size: int, cases: list[str], label: str, timeout_s: float = 150.0) -> None:
    run_ranks("tests.plugins.state_check", ["--cases", ",".join(cases), "--out", out], world_size, out, timeout_s,
              label=label)


def results(out: str) -> dict[str, dict]:
    return {os.path.basename(path)[:-3]: torch.load(path, weights_only=False)
            for path in glob.glob(os.path.join(out, "*.pt"))}


@pytest.fixture(scope="module")
def single_saved(tmp_path_factory) -> str:
    """One process's uninterrupted run and checkpoint, which every group of layouts below compares with."""
    out = str(tmp_path_factory.mktemp("single_state"))
    launch(out, 1, ["save:single"], "save_single_")
    return out


def with_single(out: str, single_saved: str) -> str:
    """``out`` holding the single-process run's checkpoint and result, as if saved there."""
    shutil.copytree(os.path.join(single_saved, "ckpt"), os.path.join(out, "ckpt"), dirs_exist_ok=True)
    shutil.copy(os.path.join(single_saved, "save_single.pt"), out)
    return out


@pytest.fixture(scope="module")
def torch_run(tmp_path_factory, single_saved):
    out = with_single(str(tmp_path_factory.mktemp("torch_state")), single_saved)
    launch(out, 2, [f"save:{layout}" for layout in TORCH_LAYOUTS], "save_torch_")
    launch(out, 2, [f"load:{layout}@{layout}" for layout in TORCH_LAYOUTS]
           + [f"load:{dst}@{src}" for dst, src in TORCH_CROSS], "load_torch_")
    launch(out, 1, ["load:single@single"] + [f"load:{dst}@{src}" for dst, src in SINGLE_CROSS], "load_single_")
    return out, results(out)


@pytest.fixture(scope="module")
def colossal_run(tmp_path_factory, single_saved):
    out = with_single(str(tmp_path_factory.mktemp("colossal_state")), single_saved)
    launch(out, 2, [f"save:{layout}" for layout in COLOSSAL_LAYOUTS], "save_colossal_")
    launch(out, 2, [f"load:{layout}@{layout}" for layout in COLOSSAL_LAYOUTS]
           + [f"load:{dst}@{src}" for dst, src in COLOSSAL_CROSS]
           + [f"refuse:{dst}@{src}" for dst, src in COLOSSAL_REFUSED], "load_colossal_")
    return out, results(out)


def compare(found: dict, layout: str, source: str, tol: float) -> str:
    """The resumed step 2 of ``layout`` from ``source``'s checkpoint against ``source``'s uninterrupted run."""
    resumed, reference = found[f"load_{name(layout)}@{name(source)}"], found[f"save_{name(source)}"]
    loaded = max_abs_diff(resumed["loaded_weights"], reference["step1_weights"])
    loss = abs(resumed["loss"] - reference["loss"])
    weights = max_abs_diff(resumed["weights"], reference["weights"])
    line = f"{source:24s} -> {layout:24s}: loaded |dw| {loaded:.1e}  step 2 |dloss| {loss:.1e}  max|dw| {weights:.1e}"
    print(line)
    assert loaded <= tol and loss <= tol and weights <= tol, line
    return line


@pytest.mark.e2e
@pytest.mark.parametrize("layout", ["single"] + TORCH_LAYOUTS)
def test_torch_layouts_resume_exactly(torch_run, layout):
    compare(torch_run[1], layout, layout, SAME_TOL)


@pytest.mark.e2e
@pytest.mark.parametrize("layout, source", [("single", "torch-fsdp2"), ("torch-fsdp2", "single")])
def test_fsdp2_and_single_load_each_others_checkpoints(torch_run, layout, source):
    compare(torch_run[1], layout, source, CROSS_TOL)


@pytest.mark.parametrize("layout, source", [c for c in TORCH_CROSS + SINGLE_CROSS
                                            if c not in [("single", "torch-fsdp2"), ("torch-fsdp2", "single")]])
@pytest.mark.e2e
def test_dcp_checkpoints_reshard_across_torch_layouts(torch_run, layout, source):
    compare(torch_run[1], layout, source, CROSS_TOL)


@pytest.mark.e2e
def test_sharded_layouts_write_their_own_shards(torch_run):
    out = torch_run[0]
    path = os.path.join(out, "ckpt", "torch-fsdp2")
    with open(os.path.join(path, "trainer_state.json")) as file:
        manifest = json.load(file)
    assert manifest == {"format": "torch-dcp", "plugin": "torch-fsdp2", "world_size": 2, "tp_size": 1, "pp_size": 1,
                        "dp_size": 2, "zero_stage": 0, "precision": "fp32", "optimizer_state": True}
    shards = {os.path.basename(f): os.path.getsize(f) for f in glob.glob(os.path.join(path, "*.distcp"))}
    assert sorted(shards) == ["__0_0.distcp", "__1_0.distcp"]
    total = sum(shards.values())
    assert all(size < 0.6 * total for size in shards.values()), shards  # halves, not one full copy


def compare_uninterrupted(found: dict, layout: str, tol: float) -> None:
    """``layout``'s uninterrupted steps 1 and 2 against one process's from the same model and batches."""
    run, single = found[f"save_{name(layout)}"], found["save_single"]
    step1 = max_abs_diff(run["step1_weights"], single["step1_weights"])
    loss, weights = abs(run["loss"] - single["loss"]), max_abs_diff(run["weights"], single["weights"])
    norm = abs(run["grad_norm"] - single["grad_norm"]) / single["grad_norm"]
    line = f"{layout:24s} vs single: step 1 max|dw| {step1:.1e}  step 2 |dloss| {loss:.1e}  max|dw| {weights:.1e}"
    print(line)
    assert step1 <= tol and loss <= tol and weights <= tol and norm <= 1e-4, line


@pytest.mark.e2e
def test_two_dimensional_torch_layouts_on_four_ranks(tmp_path, single_saved):
    """dp2 x tp2 (FSDP2 + TP DTensors on a 2-D mesh) and dp2 x pp2 (replicated stages): their two steps equal one
    process's (the step equivalence of these layouts: tests/plugins/test_equivalence.py runs the others); their
    checkpoints resume in the same layout, into single, and tp -> pp; single's into FSDP2 over 4 ranks."""
    out = with_single(str(tmp_path), single_saved)
    launch(out, 4, ["save:torch-tp:tp=2", "save:torch-pp:pp=2", "load:torch-fsdp2@single"], "save_four_", 240)
    launch(out, 4, ["load:torch-tp:tp=2@torch-tp:tp=2", "load:torch-pp:pp=2@torch-pp:pp=2",
                    "load:torch-pp:pp=2@torch-tp:tp=2"], "load_four_", 240)
    launch(out, 1, ["load:single@torch-tp:tp=2", "load:single@torch-pp:pp=2"], "load_single_")
    found = results(out)
    for layout in ("torch-tp:tp=2", "torch-pp:pp=2"):
        compare_uninterrupted(found, layout, CROSS_TOL)
        compare(found, layout, layout, SAME_TOL)
        compare(found, "single", layout, CROSS_TOL)
    compare(found, "torch-pp:pp=2", "torch-tp:tp=2", CROSS_TOL)
    compare(found, "torch-fsdp2", "single", CROSS_TOL)


def _single(num_layers: int = 2):
    from coati.plugins import make_plugin
    from tests.plugins.equivalence import grpo_batch, tiny_model

    model, tokenizer = tiny_model(num_layers=num_layers)
    plugin = make_plugin("single")
    plugin.setup(model, 1e-4)
    return plugin, grpo_batch(model.config.vocab_size, tokenizer.pad_token_id)


def test_a_checkpoint_before_the_first_step_leaves_the_run_unchanged(tmp_path):
    """No AdamW state yet: only the parameters are saved (building the state would step AdamW once)."""
    from tests.plugins.equivalence import full_weights, train_step

    plugin, batch = _single()
    plugin.save_state(str(tmp_path))
    assert not plugin.optimizer.state
    loss, _, _ = train_step(plugin, batch)
    resumed, _ = _single()
    resumed.load_state(str(tmp_path))
    assert not resumed.optimizer.state
    assert train_step(resumed, batch)[0] == loss
    assert max_abs_diff(full_weights(resumed), full_weights(plugin)) == 0.0


def test_unloadable_directories_are_value_errors(tmp_path):
    plugin, _ = _single()
    with pytest.raises(ValueError, match="not a trainer-state checkpoint"):
        plugin.load_state(str(tmp_path))
    plugin.save_state(str(tmp_path))
    other, _ = _single(num_layers=4)
    with pytest.raises(ValueError, match=r"^cannot load the single .* Missing key .*layers\.2"):
        other.load_state(str(tmp_path))


@pytest.mark.e2e
@pytest.mark.skipif(not has_colossalai, reason="colossalai is not installed (scripts/install_colossalai.sh)")
@pytest.mark.parametrize("layout", COLOSSAL_LAYOUTS)
def test_colossalai_layouts_resume_exactly(colossal_run, layout):
    compare(colossal_run[1], layout, layout, SAME_TOL)


@pytest.mark.e2e
@pytest.mark.skipif(not has_colossalai, reason="colossalai is not installed")
@pytest.mark.parametrize("layout, source", COLOSSAL_CROSS)
def test_colossalai_checkpoints_across_layouts(colossal_run, layout, source):
    compare(colossal_run[1], layout, source, CROSS_TOL)


@pytest.mark.e2e
@pytest.mark.skipif(not has_colossalai, reason="colossalai is not installed")
@pytest.mark.parametrize("layout, source", COLOSSAL_REFUSED)
def test_unreadable_layouts_are_refused_with_both_layouts_named(colossal_run, layout, source):
    error = colossal_run[1][f"refuse_{name(layout)}@{name(source)}"]["error"]
    print(error)
    assert "\n" not in error and error.startswith("cannot load the ")
    assert f"the {source.split(':')[0]} (" in error and f"into {layout.split(':')[0]} (" in error
