"""A user reward file from examples/ through a real short run on a local Ray cluster: weighted into the rewards
the trainer sees, its parts in the rollout and eval logs, the verdict of the function that defines correctness in
the logs' `correct` and the accuracy; a function that raises mid-run stops the run with one line naming the row."""

import json
import os
import subprocess
import sys

import pytest

from tests.run_helpers import ROOT, head, run_cli

EXAMPLE = os.path.join(ROOT, "examples", "rewards", "length_penalty.py")
CLOSENESS = os.path.join(ROOT, "examples", "rewards", "closeness.py")


def read_jsonl(path):
    return [json.loads(line) for line in open(path)]


@pytest.mark.e2e
@pytest.mark.timeout(400)
def test_user_reward_file_in_a_short_run(demo_assets, tmp_path):
    train = head(demo_assets.train_path, tmp_path / "train.jsonl", 32)
    evals = head(demo_assets.eval_path, tmp_path / "eval.jsonl", 8)
    argv = ["-d", train, "-ed", json.dumps({"add": evals}), "-ibs", "16", "-imbs", "16", "-g", "4", "-tbs", "8",
            "-tMbs", "8", "-tmbs", "32", "-e", "1", "-sd", str(tmp_path / "runs"), "-p", "t", "--no-progress",
            "-rsd", str(tmp_path / "rollouts"), "-esd", str(tmp_path / "evals"),
            "--reward-fn", f"{EXAMPLE}:length_penalty", "--reward-fn", f"{EXAMPLE}:exact_label",
            "--reward-fn", f"{CLOSENESS}:closeness", "--reward-weights", "boxed:2,length_penalty:100,exact_label:0.25"]
    result, rows = run_cli(argv, demo_assets)
    golds = [json.loads(line)["gt_answer"] for line in open(train)]
    assert result.steps == 4
    records = [r for name in sorted(os.listdir(tmp_path / "rollouts" / "t"))
               for r in read_jsonl(tmp_path / "rollouts" / "t" / name)]
    assert len(records) == 2 * 16 * 4  # two rounds of 16 prompts, G=4
    for r in records:
        parts = r["reward_parts"]
        assert set(parts) - {"closeness/abs_error"} == {"boxed", "length_penalty", "length_penalty/chars",
                                                        "exact_label", "closeness", "closeness/correct"}
        assert parts["length_penalty/chars"] == len(r["response"])
        expected = (2 * parts["boxed"] + 100 * parts["length_penalty"] + 0.25 * parts["exact_label"]
                    + parts["closeness"])
        assert r["reward"] == pytest.approx(expected)
        assert parts["boxed"] == (1.0 if r["reason"] == "ok" else 0.1 if r["format_ok"] else 0.0)
        assert r["correct"] is parts["closeness/correct"]  # the function that defines correctness decides it
        assert parts["length_penalty"] == pytest.approx(max(-1.0, -0.002 * max(0, len(r["response"]) - 64)))
        gold = golds[int(r["source"].rsplit(":", 1)[1]) - 1]
        assert parts["exact_label"] == float(gold in r["response"])
    train_rows = [r for r in rows if r["kind"] == "train"]
    assert len(train_rows) == 4 and all("reward" in r and "accuracy" in r for r in train_rows)
    eval_records = read_jsonl(tmp_path / "evals" / "t" / "add_greedy_step4.jsonl")
    assert all("reward_parts" in r and r["reward"] == pytest.approx(
        2 * r["reward_parts"]["boxed"] + 100 * r["reward_parts"]["length_penalty"]
        + 0.25 * r["reward_parts"]["exact_label"] + r["reward_parts"]["closeness"]) for r in eval_records)
    assert all(r["correct"] is r["reward_parts"]["closeness/correct"] for r in eval_records)
    [last] = [r for r in rows if r["kind"] == "eval" and r["step"] == 4 and r["mode"] == "greedy"]
    assert last["accuracy"] == sum(r["correct"] for r in eval_records) / len(eval_records)


@pytest.mark.e2e
@pytest.mark.timeout(400)
def test_user_reward_raising_mid_run_stops_with_one_line(demo_assets, tmp_path):
    train = head(demo_assets.train_path, tmp_path / "train.jsonl", 32)
    bad = tmp_path / "picky.py"
    # fine on the check call (the first row), raises on row 20 once training runs
    bad.write_text("def picky(response, label, row):\n"
                   "    if row['gt_answer'] == " + repr(json.loads(open(train).readlines()[19])["gt_answer"]) + ":\n"
                   "        raise ValueError('cannot score this one')\n"
                   "    return 0.0\n")
    argv = [sys.executable, "rl_example.py", "-d", train, "-ibs", "16", "-imbs", "16", "-g", "4", "-tbs", "8",
            "-tMbs", "8", "-tmbs", "32", "-e", "1", "-sd", str(tmp_path / "runs"), "-p", "t", "--no-progress",
            "-ed", json.dumps({"add": head(demo_assets.eval_path, tmp_path / "eval.jsonl", 4)}),
            "--reward-fn", f"{bad}:picky"]
    env = dict(os.environ, OMP_NUM_THREADS="1", COATI_CACHE=os.path.dirname(os.path.dirname(demo_assets.model_dir)))
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, env=env, timeout=380)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert len(lines) == 1, proc.stderr[-3000:]
    assert f"--reward-fn {bad}:picky raised on {train}:20: ValueError: cannot score this one" in lines[0]
    assert "the run stopped" in lines[0]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]  # one line, not a traceback per actor
