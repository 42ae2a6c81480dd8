"""Run ``tests.plugins.equivalence`` (or another driver module) as an N-process gloo group with a hard timeout
and a forced clean-up. The ranks see no GPU unless asked (``cuda=True``): on a machine with GPUs the group
would otherwise pick nccl, whose ranks need a GPU each, and compute on the GPU instead of the CPU the tests
compare."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_ranks(module: str, args: list[str], world_size: int, out_dir: str, timeout_s: float = 180.0,
              threads: int = 1, label: str = "", cuda: bool = False) -> None:
    """Start ``world_size`` ranks of ``python -m module *args --threads N``, wait at most ``timeout_s``, kill
    every rank left. Raises ``RuntimeError`` with the ranks' output when a rank fails or the group times out.
    Each rank's output goes to ``out_dir/{label}rank{N}.log``."""
    port = free_port()
    procs, logs = [], []
    for rank in range(world_size):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS=str(threads),
                   PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
        if not cuda:
            env["CUDA_VISIBLE_DEVICES"] = ""
        log = open(os.path.join(out_dir, f"{label}rank{rank}.log"), "w+")
        logs.append(log)
        procs.append(subprocess.Popen([sys.executable, "-m", module, *args, "--threads", str(threads)],
                                      cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True))
    deadline = time.monotonic() + timeout_s
    timed_out = False
    try:
        for proc in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
                break
    finally:
        for proc in procs:  # only the processes started here, each by its own session id
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
    outputs = []
    for rank, log in enumerate(logs):
        log.seek(0)
        outputs.append(f"--- rank {rank} (exit {procs[rank].returncode}) ---\n" + log.read()[-6000:])
        log.close()
    if timed_out or any(proc.returncode != 0 for proc in procs):
        reason = f"timed out after {timeout_s:.0f}s" if timed_out else "a rank failed"
        raise RuntimeError(f"{module} {' '.join(args)} x{world_size}: {reason}\n" + "\n".join(outputs))


def run_group(layouts: list[str], world_size: int, out_dir: str, timeout_s: float = 180.0,
              threads: int = 1, cuda: bool = False, save_layouts: list[str] = ()) -> dict[str, dict]:
    """``tests.plugins.equivalence`` over ``layouts`` on ``world_size`` ranks (see ``run_ranks``); results by layout.
    ``save_layouts``: those layouts also save and reload their weights."""
    args = ["--layouts", ",".join(layouts), "--out", out_dir] + \
        (["--save-layouts", ",".join(save_layouts)] if save_layouts else [])
    run_ranks("tests.plugins.equivalence", args, world_size, out_dir, timeout_s, threads, cuda=cuda)
    results = {}
    for layout in layouts:
        path = os.path.join(out_dir, layout.replace(":", "_") + ".pt")
        results[layout] = torch.load(path, weights_only=False)
    return results


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert set(a) == set(b), f"different parameter names: {sorted(set(a) ^ set(b))[:5]}"
    return max(float((a[name].float() - b[name].float()).abs().max()) for name in a)
