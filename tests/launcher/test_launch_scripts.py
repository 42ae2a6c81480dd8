"""The launch scripts' argument handling, run for real with a stand-in `ray` that records how it was called."""

from __future__ import annotations

import os
import stat
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def fake_tool(directory, name: str = "ray") -> tuple[str, str]:
    """(path of an executable that appends its argv to a log, the log's path)."""
    log = os.path.join(directory, f"{name}.log")
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        f.write(f'#!/usr/bin/env bash\necho "$*" >> {log}\n')
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    return path, log


def run_script(script: str, args: list[str], env: dict) -> subprocess.CompletedProcess:
    inherited = {k: v for k, v in os.environ.items() if k not in ("COATI_RAY", "COATI_PYTHON", "VIRTUAL_ENV")}
    full_env = {**inherited, "RAY_AUTH_MODE": "disabled", **env}
    return subprocess.run(["bash", os.path.join(ROOT, "launch", script), *args], env=full_env,
                          capture_output=True, text=True, timeout=60)


def ray_start_call(log: str) -> list[str]:
    calls = [line.split() for line in open(log).read().splitlines() if line.startswith("start")]
    assert len(calls) == 1, calls
    return calls[0]


@pytest.mark.parametrize("args, port, rest", [
    (["--num-gpus", "8"], "6379", ["--num-gpus", "8"]),  # flags without a port
    ([], "6379", []),
    (["6380", "--num-gpus", "8"], "6380", ["--num-gpus", "8"]),
    (["--num-gpus", "8", "--port", "7000"], "7000", ["--num-gpus", "8"]),
    (["--port=7001", "--num-cpus", "4"], "7001", ["--num-cpus", "4"]),
])
def test_start_head_takes_flags_with_or_without_a_port(tmp_path, args, port, rest):
    ray, log = fake_tool(tmp_path)
    result = run_script("start_head.sh", args, {"COATI_RAY": ray})
    assert result.returncode == 0, result.stderr
    call = ray_start_call(log)
    assert call[:2] == ["start", "--head"]
    assert [a for a in call if a.startswith("--port")] == [f"--port={port}"]
    assert call[call.index("--disable-usage-stats") + 1:] == rest  # the user's flags, passed on as given
    assert f":{port}" in result.stdout


def test_start_head_refuses_a_port_that_is_no_number(tmp_path):
    ray, log = fake_tool(tmp_path)
    result = run_script("start_head.sh", ["--port", "abc"], {"COATI_RAY": ray})
    assert result.returncode == 2 and result.stderr.strip() == "error: the port must be a number, got 'abc'"
    assert not os.path.exists(log)


def test_scripts_run_the_active_environments_ray(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    _, log = fake_tool(venv / "bin")
    fake_tool(venv / "bin", "python")
    result = run_script("start_worker.sh", ["10.0.0.1", "--num-gpus", "8"], {"VIRTUAL_ENV": str(venv)})
    assert result.returncode == 0, result.stderr
    assert ray_start_call(log) == ["start", "--address=10.0.0.1:6379", "--disable-usage-stats", "--num-gpus", "8"]
