"""--max-steps, the learning-rate schedule and --weight-decay over real Ray runs of the demo model (1 producer, sync
mode), and the schedule across a resume.

The data plan of tests/trainer/test_resume.py: 32 prompts, -ibs 8 x -g 4, 4 groups per step -> 4 rounds of 2
steps, 8 steps; --max-steps 6 ends the run after round 2 (producers generate 3 rounds), -si 3 checkpoints at
step 3 (mid-round) and the end; the first run evaluates on the training rows before and after.
"""

from __future__ import annotations

import json
import os

import pytest
from test_resume import TOL, assert_same_steps, launch, max_weight_diff, train_rows

from coati.plugins.optim import lr_multiplier
from coati.utils.checkpoint import list_checkpoints

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]
KNOBS = ["--max-steps", "6", "--lr-scheduler", "cosine", "--lr-warmup-steps", "2", "--weight-decay", "0.01"]
BASE_LR = 3e-4  # the demo's -lr


@pytest.fixture(scope="module")
def data(demo_assets, tmp_path_factory):
    from run_helpers import head

    return head(demo_assets.train_path, tmp_path_factory.mktemp("data") / "train.jsonl", 32)


@pytest.fixture(scope="module")
def knob_run(demo_assets, data, tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("knobs")
    result = launch(demo_assets, data, save_dir, "knobs", *KNOBS, "-ed", json.dumps({"add": data}))
    return result, os.path.join(save_dir, "knobs")


def test_max_steps_ends_the_run_with_evaluation_and_a_final_checkpoint(knob_run):
    result, run_dir = knob_run
    assert result.steps == 6
    assert sorted(train_rows(run_dir)) == [1, 2, 3, 4, 5, 6]
    assert [step for step, _ in list_checkpoints(run_dir)] == [3, 6]
    assert result.final_model_dir == os.path.join(run_dir, "step_6")
    assert set(result.eval_before) == set(result.eval_after) == {"add/sampled", "add/greedy"}


def test_the_logged_learning_rate_follows_the_cosine_schedule(knob_run):
    rows = train_rows(knob_run[1])
    for step, row in rows.items():  # step N trains with the multiplier of 0-based step N - 1 of 6
        assert row["lr"] == pytest.approx(BASE_LR * lr_multiplier(step - 1, 6, 2, "cosine"), rel=1e-12, abs=0)
    assert rows[1]["lr"] == 0.0 and rows[3]["lr"] == BASE_LR  # warm-up from 0, then the peak


def test_resume_inside_the_schedule_restores_the_learning_rate_exactly(demo_assets, data, knob_run, tmp_path):
    _, run_dir = knob_run
    result = launch(demo_assets, data, tmp_path, "resumed", *KNOBS, "--resume", os.path.join(run_dir, "step_3"))
    assert result.steps == 6
    reference, resumed = train_rows(run_dir), train_rows(os.path.join(tmp_path, "resumed"))
    assert sorted(resumed) == [4, 5, 6]
    for step in resumed:
        assert resumed[step]["lr"] == reference[step]["lr"], step
    assert_same_steps(reference, resumed, range(4, 7), "knobs -> knobs")
    assert max_weight_diff(os.path.join(run_dir, "step_6"), result.final_model_dir) <= TOL
