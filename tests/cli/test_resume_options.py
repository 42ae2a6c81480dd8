"""--resume restores the options its checkpoint saved: flags given again win and are listed in one line, another
-m is refused. (A real run saving and resuming them: tests/e2e/test_first_hour.py.)"""

from __future__ import annotations

import json

from coati.config.cli import build_parser, config_from_args, resumed_values
from coati.train import main, placeholder_demo
from coati.utils.checkpoint import COMPLETE_MARKER


def test_given_flags_win_over_the_saved_ones_and_are_listed():
    saved = {"learning_rate": 3e-4, "num_episodes": 1, "project": None, "resume": None, "reward_fn": ["a.py:f"]}
    values = {"learning_rate": None, "num_episodes": 2, "project": "mine", "resume": "latest", "reward_fn": ("a.py:f",)}
    merged, changed = resumed_values(saved, values, {"num_episodes", "project", "resume", "reward_fn"})
    assert merged == {"learning_rate": 3e-4, "num_episodes": 2, "project": "mine", "resume": "latest",
                      "reward_fn": ("a.py:f",)}
    assert changed == ["--num-episodes 1 -> 2"]  # where the run was found and equal values are no change


def test_the_config_keeps_the_option_values_it_was_built_from():
    config = config_from_args(build_parser().parse_args(["-e", "2", "-lr", "0.01"]), placeholder_demo())
    assert config.options["num_episodes"] == 2 and config.options["learning_rate"] == 0.01
    assert config.options["model"] is None  # before the situation's defaults: a resume re-resolves them


def test_another_model_cannot_continue_a_checkpoint(tmp_path, tiny_model_dir, capsys):
    step = tmp_path / "runs" / "r" / "step_4"
    step.mkdir(parents=True)
    (step / COMPLETE_MARKER).write_text("{}")
    (step / "run_state.json").write_text(json.dumps({"options": {"model": "/models/first", "num_episodes": 1}}))
    assert main(["--resume", "latest", "-sd", str(tmp_path / "runs"), "-p", "r", "-m", tiny_model_dir]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"error: --resume {step}: it trained /models/first; -m {tiny_model_dir} cannot continue it: drop "
                   "-m, or drop --resume to start a new run")
