"""Packaging: the ``coati`` command's registry (train = rl_example.py, plot), and setup.py reading pyproject."""

import json
import os
import subprocess
import sys

import pytest

from coati import cli

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_help_lists_every_command_and_unknown_ones_fail(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(f"  {name} " in out for name in cli.COMMANDS)
    assert cli.main([]) == 2 and "usage: coati COMMAND" in capsys.readouterr().err
    assert cli.main(["dpo"]) == 2
    assert "coati: unknown command 'dpo'; choose one of train, sft, rm, ppo, evaluate, rlhf, export, plot" in capsys.readouterr().err


def test_train_is_rl_example_with_the_same_flags(capsys):
    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    help_text = capsys.readouterr().out
    assert help_text.startswith("usage: coati train") and "--input-key" in help_text and "-tbs" in help_text
    # a bad flag is rejected before the demo assets are built, with rl_example.py's one-line error
    assert cli.main(["train", "-tbs", "16", "-tMbs", "32"]) == 2
    assert capsys.readouterr().err.strip() == "error: -tbs (16) must be >= -tMbs (32)"


def test_plot_writes_the_run_plots(tmp_path, capsys):
    rows = [{"step": s, "kind": "train", "reward": 0.1 * s, "loss": 0.5 / s} for s in (1, 2, 3)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert cli.main(["plot", str(tmp_path)]) == 0
    assert os.path.isfile(tmp_path / "plots" / "train.png")
    assert cli.main(["plot", str(tmp_path / "missing")]) == 2


def test_setup_py_takes_its_metadata_from_pyproject(tmp_path):
    proc = subprocess.run([sys.executable, "setup.py", "-q", "--name", "--version"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["coati-rl", "0.1.0"]


def test_console_script_is_installed_beside_python():
    """scripts/setup.sh installs the project editable, which puts ``coati`` into the environment's bin/."""
    script = os.path.join(os.path.dirname(sys.executable), "coati")
    assert os.path.isfile(script), "coati is not installed: pip install -e ."
    proc = subprocess.run([script, "--version"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "coati 0.1.0", proc.stdout + proc.stderr
