"""Eval records + summary, rollout log rotation, a new run in a used directory, and wandb failing in every
way it can (faults injected: wandb is not installed here) while the jsonl metrics keep going."""

import json
import os
import sys
import types

import pytest

from coati.utils.metrics import MetricsLogger
from coati.utils.run_files import EvalWriter, RolloutWriter


def read_jsonl(path):
    return [json.loads(line) for line in open(path)]


def test_eval_writer_files_and_summary(tmp_path):
    writer = EvalWriter(str(tmp_path), log=lambda m: None)
    records = [{"prompt": "1+1=", "response": "\\boxed{2}", "extracted": "2", "reward": 1.0}]
    for step in (4, 0):  # results may be written out of order; the summary stays sorted
        for mode in ("sampled", "greedy"):
            writer.write(step, "add", mode, records, {"accuracy": step / 8, "format_rate": 1.0, "version": step // 2})
    assert read_jsonl(tmp_path / "add_greedy_step4.jsonl") == records
    rows = json.load(open(tmp_path / "summary.json"))["results"]
    assert [(r["step"], r["mode"]) for r in rows] == [(0, "greedy"), (0, "sampled"), (4, "greedy"), (4, "sampled")]
    assert rows[2] == {"step": 4, "task": "add", "mode": "greedy", "accuracy": 0.5, "format_rate": 1.0, "version": 2,
                       "file": "add_greedy_step4.jsonl"}
    writer.write(4, "add", "greedy", records, {"accuracy": 0.75})  # the same key again replaces its row
    assert len(json.load(open(tmp_path / "summary.json"))["results"]) == 4
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".tmp")]

    messages = []
    EvalWriter(str(tmp_path), log=messages.append)  # a new run in the same directory
    kept = [name for name in os.listdir(tmp_path) if name.startswith("previous_")]
    assert len(kept) == 1 and "moved to" in messages[0]
    assert sorted(os.listdir(tmp_path / kept[0])) == ["add_greedy_step0.jsonl", "add_greedy_step4.jsonl",
                                                      "add_sampled_step0.jsonl", "add_sampled_step4.jsonl",
                                                      "summary.json"]
    resumed = EvalWriter(str(tmp_path / kept[0]), log=lambda m: None, resume=True)
    assert len(resumed.rows) == 4


def test_rollout_writer_rotates_at_step_boundaries(tmp_path):
    writer = RolloutWriter(str(tmp_path), max_bytes=1000, log=lambda m: None)
    record = {"step": 0, "prompt": "x" * 100}  # ~120 bytes a line
    for step in range(1, 7):
        writer.write(step, [dict(record, step=step)] * 5)  # ~600 bytes a step: a file holds 2 steps
    writer.close()
    names = sorted(os.listdir(tmp_path))
    assert names == ["rollouts_step000001.jsonl", "rollouts_step000003.jsonl", "rollouts_step000005.jsonl"]
    assert [r["step"] for r in read_jsonl(tmp_path / names[1])] == [3] * 5 + [4] * 5
    RolloutWriter(str(tmp_path), log=lambda m: None).close()  # a new run: the old logs are set aside
    assert [n for n in os.listdir(tmp_path) if n.startswith("rollouts")] == []


class FakeRun:
    def __init__(self, fail_log=False):
        self.logged, self.metrics, self.fail_log, self.finished = [], [], fail_log, False

    def define_metric(self, name, step_metric=None):
        self.metrics.append((name, step_metric))

    def log(self, values, step=None):
        if self.fail_log:
            raise OSError("disk full")
        self.logged.append((values, step))

    def finish(self):
        self.finished = True


def fake_wandb(monkeypatch, init):
    module = types.ModuleType("wandb")
    module.init = init
    monkeypatch.setitem(sys.modules, "wandb", module)


def log_some(tmp_path, messages):
    logger = MetricsLogger(str(tmp_path), "p", {"lr": 1}, log=messages.append)
    logger.log(1, {"reward": 0.5, "loss": 0.1})
    logger.log(0, {"task": "add", "mode": "greedy", "accuracy": 0.25, "version": 0}, kind="eval")
    logger.log(2, {"reward": 0.7, "loss": 0.1})
    logger.close()
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [(r["step"], r["kind"]) for r in rows] == [(1, "train"), (0, "eval"), (2, "train")]
    return logger


def test_wandb_offline_by_default_and_eval_on_its_own_axis(tmp_path, monkeypatch):
    calls, run = [], FakeRun()
    fake_wandb(monkeypatch, lambda **kwargs: calls.append(kwargs) or run)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    messages = []
    log_some(tmp_path, messages)
    assert calls[0]["mode"] == "offline" and calls[0]["project"] == "p" and calls[0]["dir"] == str(tmp_path)
    assert ("eval/*", "eval/step") in run.metrics and run.finished
    assert run.logged[0] == ({"train/reward": 0.5, "train/loss": 0.1}, 1)
    # logged after step 1 but standing for step 0: on the eval/step axis, not at wandb step 0
    assert run.logged[1] == ({"eval/step": 0, "eval/add/greedy/accuracy": 0.25, "eval/add/greedy/version": 0}, None)
    assert "wandb logging offline" in messages[-1]
    monkeypatch.setenv("WANDB_MODE", "online")
    log_some(tmp_path, [])
    assert calls[1]["mode"] == "online"


@pytest.mark.parametrize("fault, message", [
    ("missing", "wandb is not installed: metrics go to the jsonl file only (pip install wandb to add it)"),
    ("broken_import", "wandb could not be imported (AttributeError: module 'google.protobuf' has no attribute"),
    ("init_fails", "wandb could not start (ConnectionError: api.wandb.ai unreachable); metrics go to the jsonl"),
    ("log_fails", "wandb logging failed (OSError: disk full); from now on metrics go to the jsonl file only"),
])
def test_a_failing_wandb_never_stops_the_run(fault, message, tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)  # the default (offline), not the tests' own setting
    run = FakeRun(fail_log=True)
    if fault == "missing":
        monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    elif fault == "broken_import":  # a real package whose import fails, as with a protobuf version clash
        package = tmp_path / "site" / "wandb"
        package.mkdir(parents=True)
        (package / "__init__.py").write_text("raise AttributeError(\"module 'google.protobuf' has no attribute 'x'\")\n")
        monkeypatch.syspath_prepend(str(tmp_path / "site"))
        monkeypatch.delitem(sys.modules, "wandb", raising=False)
    elif fault == "init_fails":
        def init(**kwargs):
            raise ConnectionError("api.wandb.ai unreachable")
        fake_wandb(monkeypatch, init)
    else:
        fake_wandb(monkeypatch, lambda **kwargs: run)
    messages = []
    logger = log_some(tmp_path / "run", messages)  # every row still reached the jsonl
    assert sum(message in m for m in messages) == 1, messages
    assert logger._wandb is None
