"""Each command's --help describes that command and its own defaults; a user's run is named after its model."""

from __future__ import annotations

import pytest

from coati import cli
from coati.config.cli import build_parser, config_from_args, run_name
from coati.train import placeholder_demo


def help_of(capsys, command: str) -> str:
    with pytest.raises(SystemExit) as stop:
        cli.main([command, "--help"])
    assert stop.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def test_ppo_help_is_its_own(capsys):
    train, ppo = help_of(capsys, "train"), help_of(capsys, "ppo")
    assert "With no arguments: the embedded demo" in train and "With no arguments" not in ppo
    assert ppo.startswith("usage: coati ppo") and "RLHF-PPO over Ray: coati train with -a PPO as the default" in ppo
    assert "There is no demo without arguments" in ppo
    assert "with --grpo-config (default for coati ppo: PPO)" in ppo
    assert "with --grpo-config (default: GRPO)" in train


def test_the_run_is_named_after_the_model_unless_told():
    def project(argv):
        return config_from_args(build_parser().parse_args(argv), placeholder_demo()).run.project

    assert project(["-d", "d.jsonl", "-m", "models/Qwen2.5-0.5B/"]) == "Qwen2.5-0.5B"
    assert project(["-d", "d.jsonl", "-m", "Qwen/Qwen2.5-0.5B", "-p", "mine"]) == "mine"
    assert project([]) == "demo"
    assert run_name("/") == "run" and run_name("Qwen/Qwen2.5-0.5B") == "Qwen2.5-0.5B"
