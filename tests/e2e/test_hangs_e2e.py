"""Every wait bounded, on real runs that hang: a producer stuck generating, a trainer rank that never joins its
step's collectives (both injected into every Ray worker: hang_faults.py), and a real reward server on loopback that
accepts a request and never answers. Each run ends within its bound in one line naming the actor (or the server),
what it was doing and the last completed step, and the checkpoints written before still resume."""

from __future__ import annotations

import json
import os
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import ray

from coati.cluster.supervision import ActorStuck, RunStopped, resume_hint
from coati.config.cli import build_parser, config_from_args
from coati.launcher.checkpoints import check_resume, read_run_state
from coati.launcher.preflight import check_inputs
from coati.launcher.rl import run
from coati.utils.checkpoint import list_checkpoints
from run_helpers import MODULE_RAY_CPUS, head

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
WAIT_SCALE = 0.05  # a later step's bound: 0.05 x max(300 s, 10 x the slowest step) = 15 s on this tiny run
SLACK_S = 30.0  # after the bound: asking the buffer, killing the actors, collecting their calls (a loaded machine)


@pytest.fixture(scope="module")
def marks(tmp_path_factory):
    """The module's Ray cluster, with the hangs armed in every worker; the directory they mark their start in."""
    marks = tmp_path_factory.mktemp("hang_marks")
    path = os.pathsep.join(p for p in (HERE, ROOT, os.environ.get("PYTHONPATH")) if p)
    ray.init(address="local", num_cpus=MODULE_RAY_CPUS, include_dashboard=False, logging_level="ERROR",
             log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": path, "COATI_HANG_MARKS": str(marks)},
                                               "worker_process_setup_hook": "hang_faults.install"})
    return marks


def stopped_run(demo_assets, tmp_path, project: str, *flags: str):
    """Run the demo (rounds of 8 prompts x 4, a checkpoint every 2 steps) until it stops: (the RunStopped,
    seconds from its raising back, the run directory, the argv)."""
    train = head(demo_assets.train_path, tmp_path / "train.jsonl", 32)
    argv = ["-d", train, "-ibs", "8", "-imbs", "8", "-g", "4", "-tbs", "4", "-tMbs", "4", "-tmbs", "8", "-e", "1",
            "-si", "2", "-sd", str(tmp_path / "runs"), "-p", project, "--no-progress", "--wait-scale", str(WAIT_SCALE),
            "-ed", json.dumps({"add": head(demo_assets.eval_path, tmp_path / "eval.jsonl", 4)}), *flags]
    config = config_from_args(build_parser().parse_args(argv), demo_assets)
    check_inputs(config)
    with pytest.raises(RunStopped) as stopped:
        run(config, log=lambda message: None)
    print(stopped.value)
    return stopped.value, time.time(), tmp_path / "runs" / project, argv


def assert_within_bound(line: str, began: float, ended: float) -> None:
    bound = float(re.search(r"no answer within ([0-9.]+) s", line).group(1))
    print(f"stopped {ended - began:.1f} s after the hang began (bound {bound:g} s)")
    assert "\n" not in line and ended - began <= bound + SLACK_S, (ended - began, bound)


def assert_resumable(demo_assets, argv: list[str], run_dir, step: int) -> None:
    """The newest checkpoint is step ``step``'s, whole, and --resume latest accepts it."""
    assert [s for s, _ in list_checkpoints(str(run_dir))] == [step]
    config = config_from_args(build_parser().parse_args(argv + ["--resume", "latest"]), demo_assets)
    path = check_resume(config)
    assert path.endswith(f"step_{step}") and read_run_state(path)["step"] == step


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_a_producer_stuck_generating_ends_the_run_naming_it(marks, demo_assets, tmp_path):
    error, ended, run_dir, argv = stopped_run(demo_assets, tmp_path, "stuck-producer")
    line = str(error)
    # round 1 feeds steps 3 and 4: steps 1-2 (round 0) were trained and saved
    assert isinstance(error, ActorStuck) and line.startswith("inferencer 0 (pid "), line
    assert " is stuck generating round 1: no answer within 15.0 s (--wait-scale 0.05); last completed step 2;" in line
    assert line.endswith(f"Continue it with --resume {run_dir / 'step_2'} (the newest complete checkpoint; "
                         "or --resume latest)."), line
    assert_within_bound(line, float((marks / "stuck-producer").read_text()), ended)
    assert_resumable(demo_assets, argv, run_dir, 2)


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_a_trainer_rank_that_never_joins_its_step_ends_the_run_naming_it(marks, demo_assets, tmp_path):
    error, ended, run_dir, argv = stopped_run(demo_assets, tmp_path, "stuck-trainer", "-t", "2")
    line = str(error)
    # two ranks train a round (8 groups) per step: rank 1 never begins step 3, rank 0 waits for it in a collective
    assert isinstance(error, ActorStuck) and line.startswith("trainer rank 1 (pid "), line
    assert (" is stuck before step 3 (its peers wait for it in the step's collectives): no answer within 15.0 s "
            "(--wait-scale 0.05); last completed step 2;") in line, line
    assert_within_bound(line, float((marks / "stuck-trainer").read_text()), ended)
    assert_resumable(demo_assets, argv, run_dir, 2)


class SilentAfterFirstRound(BaseHTTPRequestHandler):
    """Scores 0 for everything until the second training round (32 items), whose request it takes and never
    answers: the server is up, the connection open, no reply comes."""

    rounds, hung_at = 0, []

    def do_POST(self):  # noqa: N802 - the http.server name
        items = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["items"]
        if len(items) == 32:
            type(self).rounds += 1
            if type(self).rounds >= 2:
                type(self).hung_at.append(time.time())
                time.sleep(3600)
        body = json.dumps({"scores": [0.0] * len(items)}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_a_reward_server_that_never_answers_ends_the_run_naming_it(marks, demo_assets, tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), SilentAfterFirstRound)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/score"
    try:
        error, ended, run_dir, argv = stopped_run(demo_assets, tmp_path, "silent-server", "--reward-url", url,
                                                  "--reward-url-timeout", "1", "--reward-url-retries", "1")
    finally:
        server.shutdown()
    line = str(error)
    # the scorer gives up after 2 tries of 1 s and 0.5 s between, well within the driver's bound
    assert line.startswith(f"reward server {url} is down: no reply within 1 s (2 tries); start it or fix "
                           "--reward-url; the run stopped. Continue it with --resume"), line
    print(f"stopped {ended - SilentAfterFirstRound.hung_at[0]:.1f} s after the server stopped answering")
    assert "\n" not in line and ended - SilentAfterFirstRound.hung_at[0] <= 2.5 + SLACK_S
    assert_resumable(demo_assets, argv, run_dir, 2)


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_an_engine_that_fails_ends_the_run_in_one_line_naming_it(marks, demo_assets, tmp_path):
    error, _, run_dir, argv = stopped_run(demo_assets, tmp_path, "broken-engine")
    line = str(error)
    log = run_dir / "engine_error_inferencer_0.log"
    assert line.startswith("inferencer 0's engine (transformers) failed generating: RuntimeError: CPU Generator does "
                           f"not use offset (traceback: {log}). If memory ran out, lower -imbs"), line
    # the failure may reach the driver before or after it saved step 2 (round 1 is generated meanwhile)
    assert line.endswith(f"-mnt; the run stopped. {resume_hint(str(run_dir))}"), line
    assert "\n" not in line and ", in broken" in log.read_text()


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_an_engine_that_cannot_start_ends_the_run_in_one_line_before_training(marks, demo_assets, tmp_path):
    """The actor stays up (its constructor keeps the failure): the driver's first call to it raises the line."""
    error, _, run_dir, _ = stopped_run(demo_assets, tmp_path, "engine-wont-start")
    line = str(error)
    assert line.startswith("inferencer 0's engine (transformers) failed to start: RuntimeError: the engine could not "
                           f"allocate its cache (traceback: {run_dir / 'engine_error_inferencer_0.log'})"), line
    assert "\n" not in line and line.endswith("No complete checkpoint under "
                                               f"{run_dir} yet: start again (-si N saves one every N steps).")
