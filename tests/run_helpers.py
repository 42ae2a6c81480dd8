"""What the end-to-end tests share: small data files cut from the demo's, and one CLI-configured run over Ray."""

from __future__ import annotations

import json
from contextlib import contextmanager

import pytest
import ray

import coati.distributed.checkpointing as checkpointing

from coati.distributed.cli import build_parser, config_from_args
from coati.distributed.config import check_inputs
from coati.distributed.launch import run


def head(src, dst, n):
    """The first ``n`` lines of ``src`` written to ``dst``; its path."""
    with open(src) as f_in, open(dst, "w") as f_out:
        for _ in range(n):
            f_out.write(f_in.readline())
    return str(dst)


def run_cli(argv: list[str], demo_assets):
    """Parse and check ``argv`` like rl_example.py, run it on a local Ray cluster (always shut down after);
    (RunResult, every metrics.jsonl row)."""
    config = config_from_args(build_parser().parse_args(argv), demo_assets)
    check_inputs(config)
    try:
        result = run(config, log=lambda message: None)
    finally:
        ray.shutdown()
    return result, [json.loads(line) for line in open(result.metrics_path)]


class Killed(BaseException):
    """The process 'dies' (not an Exception: nothing on the way may catch it)."""


@contextmanager
def killed_while_saving(monkeypatch, step: int):
    """The run dies while saving checkpoint ``step``: after the trainer ranks wrote their state, before the
    run state and the completion marker. Expects the run inside to die so."""
    write = checkpointing.write_run_state

    def dies(staging, state):
        if state["step"] == step:
            raise Killed(f"killed while saving step {step}")
        write(staging, state)

    monkeypatch.setattr(checkpointing, "write_run_state", dies)
    with pytest.raises(Killed):
        yield
    monkeypatch.undo()
