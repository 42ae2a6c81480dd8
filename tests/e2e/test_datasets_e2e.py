"""Datasets as users have them, end to end: MATH-shaped rows in parquet and a save_to_disk directory train the
demo model for a few steps through --input-key/--label-key, and the gold answers the reward scores against are
the final answers the labels hold. GSM8K's shape ("#### answer") and every file format load the same examples in
tests/dataset/test_rows.py and test_loader.py; one run through the keys proves what a run adds to them."""

import json
import os

import pytest

from run_helpers import run_cli


def addition_rows(path: str, n: int) -> list[tuple[str, str]]:
    """(prompt, sum) of the first ``n`` demo problems, e.g. ("34+35=", "69")."""
    rows = []
    with open(path) as handle:
        for line in handle:
            if len(rows) == n:
                break
            row = json.loads(line)
            rows.append((row["messages"]["content"], row["gt_answer"]))
    return rows


def math(prompt: str, answer: str) -> dict:
    return {"problem": prompt, "solution": f"Adding the two numbers, ${prompt}\\boxed{{{answer}}}$.",
            "level": "Level 1", "type": "Prealgebra"}


def save(rows: list[dict], path) -> str:
    import datasets

    path = str(path)
    if path.endswith(".parquet"):
        datasets.Dataset.from_list(rows).to_parquet(path)
    else:
        datasets.Dataset.from_list(rows).save_to_disk(path)
    return path


SHAPES = [  # (name, row maker, train file, eval file, flags, weight versions published)
    # two inferencers (one round of 32 prompts) and the evaluator actor: every actor loads a model
    ("math", math, "train.parquet", "test_dir", ["--input-key", "problem", "--label-key", "solution",
                                                 "-i", "2", "-ei", "2"], 1),
]
# What actors used to print between the progress bar and the eval lines (coati/utils/actor_process.py).
NOISE = ("Loading weights", "Writing model shards", "Ray deduplicates logs")


@pytest.mark.e2e
@pytest.mark.timeout(400)
@pytest.mark.parametrize("name, make, train_name, eval_name, flags, versions", SHAPES, ids=[s[0] for s in SHAPES])
def test_math_shaped_data_trains_through_its_keys(demo_assets, tmp_path, capfd, name, make, train_name, eval_name, flags,
                                          versions):
    train_rows = addition_rows(demo_assets.train_path, 32)
    eval_rows = addition_rows(demo_assets.eval_path, 16)
    train = save([make(*row) for row in train_rows], tmp_path / train_name)
    evals = save([make(*row) for row in eval_rows], tmp_path / eval_name)
    argv = ["-d", train, "-ed", json.dumps({name: evals}), *flags, "-ibs", "16", "-imbs", "16", "-g", "4",
            "-tbs", "8", "-tMbs", "4", "-tmbs", "8", "-e", "1", "-sd", str(tmp_path / "runs"), "-p", name,
            "--no-progress"]
    capfd.readouterr()
    result, rows = run_cli(argv, demo_assets)
    out, err = capfd.readouterr()  # the actors' output, forwarded by Ray to this process
    assert not [noise for noise in NOISE if noise in out + err], out + err
    assert result.steps == 4  # 32 prompts, 16 per inferencer round: 4 steps of 8 groups
    train_metrics = [r for r in rows if r["kind"] == "train"]
    assert len(train_metrics) == 4 and train_metrics[-1]["weight_version"] == versions
    # The warm-started model adds correctly about half the time: scored against the labels' final answers,
    # rollouts and evals find correct answers (a whole solution taken as the gold would never match).
    assert sum(r["accuracy"] for r in train_metrics) > 0
    records = [json.loads(line) for line in open(os.path.join(tmp_path, "runs", name, "eval",
                                                              f"{name}_greedy_step0.jsonl"))]
    assert [(r["prompt"], r["gt_answer"]) for r in records] == eval_rows
    assert sum(r["correct"] for r in records) > 0
    assert all(float(r["extracted"]) == float(r["gt_answer"]) for r in records if r["correct"])
