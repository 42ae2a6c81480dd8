"""Async rollouts (-nb S > 0) over real Ray runs of the demo model: a crash and a resume train every prompt of
the episode exactly once, and the demo learns with S = 1."""

from __future__ import annotations

import json
import os

import pytest
from run_helpers import head, killed_while_saving, run_cli

import coati.launcher.checkpoints as checkpointing
from coati.rollout.rollout_log import trained_prompt_counts
from coati.utils.checkpoint import list_checkpoints, resolve_resume

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


def test_crash_and_resume_train_every_prompt_once(demo_assets, tmp_path, monkeypatch):
    """-nb 2, rounds of 8 prompts generated 4 per call (a round may mix versions): the save at step 6 dies, the
    run resumes from step 3 (its buffer then holds up to 3 rounds ahead of the trainer, some groups generated
    and not drawn); across the crashed run's steps 1-3 and the resumed run's, each of the 32 prompts is trained
    on exactly once."""
    data = head(demo_assets.train_path, tmp_path / "train.jsonl", 32)
    argv = ["-d", data, "-ibs", "8", "-imbs", "4", "-g", "4", "-tbs", "4", "-tMbs", "4", "-tmbs", "8", "-e", "1",
            "-nb", "2", "-si", "3", "-sd", str(tmp_path), "-p", "async", "--no-progress"]
    with killed_while_saving(monkeypatch, 6):
        run_cli(argv + ["-rsd", str(tmp_path / "before")], demo_assets)
    run_dir = os.path.join(tmp_path, "async")
    assert [step for step, _ in list_checkpoints(run_dir)] == [3]
    assert not os.path.exists(os.path.join(run_dir, "step_6"))  # the half-written save is gone, not listed
    assert resolve_resume("latest", run_dir).endswith("step_3")
    state = json.load(open(os.path.join(run_dir, "step_3", checkpointing.RUN_STATE)))
    print(f"checkpoint at step 3: weights v{state['policy_version']}, {state['pending_groups']} undrawn groups, "
          f"producer at round {state['producer_rounds']}")
    assert state["consumer"]["drawn_total"] == 16 and state["policy_version"] == 1  # round 1 drawn at step 3
    assert 16 + state["pending_groups"] == 8 * state["producer_rounds"][0]  # drawn + stored = rounds put

    # --keep-checkpoints 1: each save (steps 6 and 8) deletes the older ones, step_3 it resumed from included
    result, rows = run_cli(argv + ["--resume", "latest", "-rsd", str(tmp_path / "after"), "--keep-checkpoints", "1"],
                           demo_assets)
    assert result.steps == 8
    assert [step for step, _ in list_checkpoints(run_dir)] == [8]
    counts = trained_prompt_counts(str(tmp_path / "before" / "async"), steps=range(1, 4)) + \
        trained_prompt_counts(str(tmp_path / "after" / "async"))
    assert sorted(counts.values()) == [1] * 32, counts
    train = [r for r in rows if r["kind"] == "train"]
    assert [r["step"] for r in train] == list(range(1, 9))
    assert all(r["staleness_max"] <= 2 for r in train)


def test_dapo_and_evaluation_under_staleness(demo_assets, tmp_path):
    """DAPO's dynamic batching (mid-step publishes) and -ei evaluation work with -nb 1; the run ends cleanly."""
    data = head(demo_assets.train_path, tmp_path / "train.jsonl", 32)
    held_out = json.dumps({"addition": head(demo_assets.eval_path, tmp_path / "eval.jsonl", 32)})
    result, rows = run_cli(["-d", data, "-ed", held_out, "-ibs", "8", "-imbs", "4", "-g", "4", "-tbs", "4", "-tMbs",
                            "4", "-tmbs", "8", "-e", "1", "-a", "DAPO", "-nb", "1", "-ei", "2", "-sd", str(tmp_path),
                            "-p", "dapo", "--no-progress"], demo_assets)
    train = [r for r in rows if r["kind"] == "train"]
    assert sum(r["groups_drawn"] for r in rows if r["kind"] in ("train", "skipped")) == 32
    assert all(r["staleness_max"] <= 1 for r in train)
    evals = sorted({r["step"] for r in rows if r["kind"] == "eval"})
    assert evals[0] == 0 and evals[-1] == result.steps and len(evals) >= 2


def test_async_demo_learns(demo_assets, tmp_path):
    """The embedded demo with -nb 1 for the first half of its 192 steps (its learning rate is constant, as in
    test_demo_cli_learns): held-out sampled accuracy rises by 15+ points. Its weights travel by
    ``--weight-sync collective``, which in async mode loads them between the engine's -imbs chunks (two a round
    here: -imbs 32 of -ibs 64). The object store's async path: the other tests here; the two paths step for step:
    tests/e2e/test_weight_sync_e2e.py.

    Measured at step 96 with the default (behaviour) correction: +29.9 points (docs/results.md); async rounds
    are not reproducible step for step, so the bar keeps half of that. After all 192 steps the gain is about 40
    points, and the decoupled correction measured about 12 points lower."""
    result, rows = run_cli(["-nb", "1", "--max-steps", "96", "--weight-sync", "collective", "-imbs", "32",
                            "-sd", str(tmp_path), "-p", "demo", "--no-progress"], demo_assets)
    before, after = result.eval_before["addition/sampled"], result.eval_after["addition/sampled"]
    train = [r for r in rows if r["kind"] == "train"]
    print(f"async demo -nb 1: {result.steps} steps in {result.wall_s:.0f} s, sampled {before:.3f} -> {after:.3f}, "
          f"greedy {result.eval_before['addition/greedy']:.3f} -> {result.eval_after['addition/greedy']:.3f}, "
          f"mean staleness {sum(r['staleness_mean'] for r in train) / len(train):.2f}")
    assert result.steps == 96 and after - before >= 0.15
    assert max(r["staleness_max"] for r in train) == 1
