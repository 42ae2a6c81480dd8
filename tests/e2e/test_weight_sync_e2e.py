"""--weight-sync collective end to end: the demo trains exactly as with the object store (sync mode, two
producers, -ei snapshots) and resumes from a checkpoint."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from run_helpers import head, run_cli


def short_run(demo_assets, tmp_path, *extra):
    train = head(demo_assets.train_path, tmp_path / "train.jsonl", 32)
    evals = head(demo_assets.eval_path, tmp_path / "eval.jsonl", 8)
    return ["-d", train, "-ed", json.dumps({"add": evals}), "-i", "2", "-ibs", "8", "-imbs", "8", "-g", "4",
            "-tbs", "8", "-tMbs", "4", "-tmbs", "8", "-e", "1", "-p", "t", "--no-progress", *extra]


def rows_of(rows, kind):
    return [r for r in rows if r["kind"] == kind]


@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_collective_sync_trains_step_for_step_like_the_object_store(demo_assets, tmp_path):
    runs = {}
    for mode in ("object-store", "collective"):
        argv = short_run(demo_assets, tmp_path, "--weight-sync", mode, "-sd", str(tmp_path / mode), "-ei", "2",
                         "-si", "2")
        runs[mode] = run_cli(argv, demo_assets)
    (store_result, store_rows), (coll_result, coll_rows) = runs["object-store"], runs["collective"]
    assert coll_result.steps == store_result.steps == 4  # 2 producers x 2 rounds of 8 prompts, 2 steps a round
    keys = ("loss", "reward", "accuracy", "grad_norm", "weight_version", "policy_lag")
    assert [[r[k] for k in keys] for r in rows_of(coll_rows, "train")] == \
           [[r[k] for k in keys] for r in rows_of(store_rows, "train")]
    assert rows_of(coll_rows, "train")[-1]["weight_version"] == 2
    evals = [(r["step"], r["mode"], r["version"], r["on_sync"], r["accuracy"]) for r in rows_of(coll_rows, "eval")]
    assert evals == [(r["step"], r["mode"], r["version"], r["on_sync"], r["accuracy"])
                     for r in rows_of(store_rows, "eval")]
    assert [e[:4] for e in evals if e[1] == "greedy"] == [(0, "greedy", 0, True), (2, "greedy", 1, True),
                                                          (4, "greedy", 2, True)]
    final = [AutoModelForCausalLM.from_pretrained(r.final_model_dir).state_dict() for r in (store_result, coll_result)]
    assert all(torch.equal(final[0][name], final[1][name]) for name in final[0])

    # Resume the collective run from step 2: the checkpoint's weights are broadcast again, steps 3-4 repeat.
    argv = short_run(demo_assets, tmp_path, "--weight-sync", "collective", "-sd", str(tmp_path / "collective"),
                     "--resume", str(tmp_path / "collective" / "t" / "step_2"))
    resumed, resumed_rows = run_cli(argv, demo_assets)
    assert resumed.steps == 4
    assert [r["loss"] for r in rows_of(resumed_rows, "train")] == [r["loss"] for r in rows_of(coll_rows, "train")]


# Async rollouts over --weight-sync collective (loads between -imbs chunks): tests/trainer/test_async.py::
# test_async_demo_learns, which learns through it.
