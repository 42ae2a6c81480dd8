import json
import os
import signal
import subprocess
import sys
import time

import pytest

from coati.utils.checkpoint import (COMPLETE_MARKER, atomic_directory, changed_settings, list_checkpoints, mark_complete,
                                   prune_checkpoints, resolve_resume)


def write_checkpoint(run_dir, step, payload="weights"):
    with atomic_directory(os.path.join(run_dir, f"step_{step}")) as staging:
        with open(os.path.join(staging, "model.bin"), "w") as handle:
            handle.write(payload)
        with open(os.path.join(staging, COMPLETE_MARKER), "w") as handle:
            json.dump({"step": step}, handle)


def test_atomic_save_list_and_resave(tmp_path):
    write_checkpoint(tmp_path, 2)
    write_checkpoint(tmp_path, 10)
    assert [step for step, _ in list_checkpoints(str(tmp_path))] == [2, 10]
    write_checkpoint(tmp_path, 10, payload="newer")
    assert open(tmp_path / "step_10" / "model.bin").read() == "newer"
    assert sorted(os.listdir(tmp_path)) == ["step_10", "step_2"]  # no staging or retired leftovers
    assert resolve_resume("latest", str(tmp_path)).endswith("step_10")


def test_failed_save_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError):
        with atomic_directory(str(tmp_path / "step_5")) as staging:
            open(os.path.join(staging, "partial"), "w").close()
            raise RuntimeError("disk full")
    assert os.listdir(tmp_path) == []


SLOW_SAVE = """
import os, sys, time
sys.path.insert(0, {root!r})
from coati.utils.checkpoint import atomic_directory
with atomic_directory(os.path.join({run_dir!r}, "step_20")) as staging:
    open(os.path.join(staging, "model.bin"), "w").write("half")
    open(os.path.join({run_dir!r}, "saving"), "w").close()
    time.sleep(60)
"""


def test_kill_during_save_keeps_previous_checkpoint(tmp_path):
    write_checkpoint(tmp_path, 10)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.Popen([sys.executable, "-c", SLOW_SAVE.format(root=root, run_dir=str(tmp_path))])
    deadline = time.time() + 60
    while not os.path.exists(tmp_path / "saving") and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert [step for step, _ in list_checkpoints(str(tmp_path))] == [10]
    assert not os.path.exists(tmp_path / "step_20")
    assert resolve_resume("latest", str(tmp_path)).endswith("step_10")


def test_resume_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        resolve_resume("latest", str(tmp_path))
    (tmp_path / "step_3").mkdir()
    with pytest.raises(FileNotFoundError, match="not a complete checkpoint"):
        resolve_resume(str(tmp_path / "step_3"), str(tmp_path))


def test_prune_keeps_the_newest_n_and_the_one_just_written(tmp_path):
    for step in (2, 4, 6, 8):
        write_checkpoint(tmp_path, step)
    os.makedirs(tmp_path / "step_10")  # being written by someone else: no marker, never touched
    deleted = prune_checkpoints(str(tmp_path), 2, str(tmp_path / "step_8"))
    assert [os.path.basename(path) for path in deleted] == ["step_2", "step_4"]
    assert sorted(os.listdir(tmp_path)) == ["step_10", "step_6", "step_8"]  # no retired leftovers
    # A run resumed from step_3 while step_6 and step_8 exist: the new step_5 survives, the oldest other goes.
    write_checkpoint(tmp_path, 5)
    assert [os.path.basename(p) for p in prune_checkpoints(str(tmp_path), 2, str(tmp_path / "step_5"))] == ["step_6"]
    assert [step for step, _ in list_checkpoints(str(tmp_path))] == [5, 8]
    assert prune_checkpoints(str(tmp_path), 1, str(tmp_path / "step_5"))[0].endswith("step_8")
    assert [step for step, _ in list_checkpoints(str(tmp_path))] == [5]


def test_changed_settings_names_each_changed_or_missing_one_in_order():
    saved = {"seed": 42, "batch_size": 32, "epochs": 1}
    now = {"seed": 42, "batch_size": 16, "epochs": 1, "eval_fraction": 0.1}
    assert changed_settings(saved, now) == ["batch_size 32 -> 16", "eval_fraction None -> 0.1"]
    assert changed_settings(saved, dict(saved)) == []


def test_mark_complete_is_what_makes_a_staged_directory_a_checkpoint(tmp_path):
    run = tmp_path / "run"
    with atomic_directory(str(run / "step_1")) as staging:
        (tmp_path / "unused").write_text(staging)  # staged and renamed into place, but never marked
    with atomic_directory(str(run / "step_2")) as staging:
        mark_complete(staging, {"step": 2})
    assert sorted(os.listdir(run)) == ["step_1", "step_2"]
    assert list_checkpoints(str(run)) == [(2, str(run / "step_2"))]
    assert json.loads((run / "step_2" / COMPLETE_MARKER).read_text()) == {"step": 2}
