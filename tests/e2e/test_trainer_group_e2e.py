"""Multi-rank trainer groups through the CLI's launch path: rendezvous, weight sync, saving and shutdown.

tests/trainer/test_trainer_group.py checks that each layout trains exactly like one process; this file
checks that ``launch.run`` drives a whole short run with those groups (2 trainer actors + 1 producer on a
real local Ray cluster) and leaves a checkpoint plain transformers loads.
"""

import json

import pytest
import torch
from run_helpers import head, run_cli
from transformers import AutoModelForCausalLM

# ColossalAI Hybrid TP: step for step in tests/trainer/test_trainer_group.py, saved and reloaded in
# tests/plugins/test_equivalence.py; the CLI path of the colossalai family runs here as Hybrid PP.
LAYOUTS = [
    ("torch-fsdp2", ["-t", "2", "-zero", "2"], 2),  # (name, flags, data-parallel size)
    ("colossalai-hybrid-pp", ["-t", "2", "-pp", "2", "--plugin", "colossalai"], 1),
]


@pytest.mark.e2e
@pytest.mark.timeout(400)
@pytest.mark.parametrize("name, flags, dp", LAYOUTS, ids=[name for name, _, _ in LAYOUTS])
def test_short_run_with_a_two_rank_trainer_group(demo_assets, tmp_path, name, flags, dp):
    if "colossalai" in flags:
        pytest.importorskip("colossalai", reason="ColossalAI not installed (bash scripts/install_colossalai.sh .venv)")
    train = head(demo_assets.train_path, tmp_path / "train.jsonl", 32)
    evals = head(demo_assets.eval_path, tmp_path / "eval.jsonl", 16)
    argv = ["-d", train, "-ed", json.dumps({"add": evals}), "-ibs", "16", "-imbs", "16", "-g", "4",
            "-tbs", "8", "-tMbs", "4", "-tmbs", "8", "-e", "1", "-sd", str(tmp_path / "runs"), "-p", name,
            "--no-progress", *flags]
    result, rows = run_cli(argv, demo_assets)
    # 32 prompts / 16 per round = 2 rounds of 16 groups; dp * tbs groups per step
    assert result.steps == 2 * 16 // (dp * 8)
    train_rows = [r for r in rows if r["kind"] == "train"]
    assert train_rows[-1]["weight_version"] == 2
    assert all(r["policy_lag"] == 0 for r in train_rows)
    assert all(r["groups_kept"] == dp * 8 for r in train_rows)
    eval_rows = [r for r in rows if r["kind"] == "eval" and r["step"] == result.steps]
    assert {r["version"] for r in eval_rows} == {2}  # the producer evaluated the group's last weights

    before = AutoModelForCausalLM.from_pretrained(demo_assets.model_dir).state_dict()
    after = AutoModelForCausalLM.from_pretrained(result.final_model_dir).state_dict()
    assert before.keys() == after.keys()
    assert all(not torch.equal(before[key], after[key]) for key in before), "every tensor should move"
