"""A soak run (issue 43): one GRPO run of many rounds under periodic faults, continued with ``--resume latest``
after each fault that stops it, then counted: every prompt trained exactly once, no step twice, nothing lost.

    .venv/bin/python benchmarks/soak.py [--prompts 192] [--out DIR]

The embedded demo's model and prompts, one inferencer and two trainer ranks (torch DDP) on a local Ray cluster,
rounds of 8 prompts x 4 samples trained in 2 steps, a checkpoint every 2 steps, rewards from a real HTTP reward
server on loopback (``--reward-url``: 1 when the response's last number is the sum). The faults, by step:

- the inferencer's process SIGKILLed (twice): Ray restarts it and it generates its round again; the run goes on;
- the reward server stopped and started again on its port (twice): the scorer's retries carry the run over;
- trainer rank 1 SIGKILLed: the run stops with one line; it is continued from its newest checkpoint;
- trainer rank 1 stuck, alive and never answering (benchmarks/soak_faults.py): the run stops within its wait's
  bound (``--wait-scale 0.05``: 15 s for a step) with one line naming the rank; it is continued.

Counts: each run segment's rollout logs (``-rsd``), up to the checkpoint the next segment continued from, give how
often each prompt was trained on; ``metrics.jsonl`` (rows after a checkpoint are dropped when a run continues from
it) gives the steps. It exits 1 when a count is off.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

STEPS_PER_ROUND = 2  # -ibs 8 prompts, 4 groups a step (2 ranks x -tbs 2)


class AdditionScores(BaseHTTPRequestHandler):
    """The reward server: 1 when the last integer of the response is the label, else 0."""

    def do_POST(self):  # noqa: N802 - the http.server name
        items = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["items"]
        scores = []
        for item in items:
            numbers = re.findall(r"-?\d+", item["response"])
            scores.append(float(bool(numbers) and numbers[-1] == str(item["label"]).strip()))
        body = json.dumps({"scores": scores, "correct": [score == 1.0 for score in scores]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class RewardServer:
    """The server on one loopback port, which ``restart`` stops and starts again on the same port."""

    def __init__(self):
        self.server = self._start(0)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/score"

    @staticmethod
    def _start(port: int) -> ThreadingHTTPServer:
        server = ThreadingHTTPServer(("127.0.0.1", port), AdditionScores)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server

    def restart(self, down_s: float = 1.0) -> None:
        self.stop()
        time.sleep(down_s)
        self.server = self._start(self.port)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def train_steps(run_dir: str) -> list[int]:
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        return []
    with open(path) as handle:
        rows = [json.loads(line) for line in handle if line.strip()]
    return [row["step"] for row in rows if row["kind"] == "train"]


class Faults(threading.Thread):
    """Watches the run's steps and sets off each fault once, when the run has trained past its step."""

    def __init__(self, run_dir: str, server: RewardServer, hang_file: str, total_steps: int):
        super().__init__(daemon=True)
        self.run_dir, self.server, self.hang_file = run_dir, server, hang_file
        quarter = total_steps // 4
        # (after step, what): the kill and the hang land mid-segment, each after a checkpoint (-si 2)
        self.schedule = [(2, "kill inferencer"), (quarter, "restart reward server"), (quarter + 3, "kill trainer rank 1"),
                         (2 * quarter + 2, "hang trainer rank 1"), (3 * quarter, "kill inferencer"),
                         (3 * quarter + 2, "restart reward server")]
        self.done: list[tuple[str, int, float]] = []  # (what, the step it came after, when)
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.is_set() and len(self.done) < len(self.schedule):
            after, what = self.schedule[len(self.done)]
            steps = train_steps(self.run_dir)
            if steps and max(steps) >= after:
                self._do(what, max(steps))
            time.sleep(0.2)

    def _do(self, what: str, step: int) -> None:
        with open(os.path.join(self.run_dir, "placement.json")) as handle:
            placement = json.load(handle)
        if what == "kill inferencer":
            os.kill(placement["inferencers"][0]["pid"], signal.SIGKILL)
        elif what == "kill trainer rank 1":
            os.kill(placement["trainers"][1]["pid"], signal.SIGKILL)
        elif what == "restart reward server":
            self.server.restart()
        elif what == "hang trainer rank 1":
            with open(self.hang_file, "w") as handle:
                handle.write(str(step + 2))  # the rank hangs before that step
        print(f"soak: {what} after step {step}", flush=True)
        self.done.append((what, step, time.time()))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=192, help="training prompts (8 a round, 2 steps a round)")
    parser.add_argument("--out", default=None, help="where the run goes (default: a new temporary directory)")
    args = parser.parse_args(argv)
    if args.prompts % 32 or args.prompts < 64:
        parser.error("--prompts must be a multiple of 32, at least 64 (four quarters of whole rounds)")

    import ray

    from coati.cluster.supervision import RunStopped
    from coati.config.cli import build_parser, config_from_args
    from coati.demo.math_demo import ensure_demo_assets
    from coati.launcher.preflight import check_inputs
    from coati.launcher.rl import run
    from coati.rollout.rollout_log import trained_prompt_counts
    from coati.utils.checkpoint import list_checkpoints

    start = time.time()
    os.environ.setdefault("WANDB_MODE", "disabled")  # its metrics.jsonl is all the counts read
    out = args.out or tempfile.mkdtemp(prefix="coati-soak-")
    os.makedirs(out, exist_ok=True)
    assets = ensure_demo_assets(log=lambda message: None)
    data = os.path.join(out, "train.jsonl")
    with open(assets.train_path) as src, open(data, "w") as dst:
        dst.writelines(src.readline() for _ in range(args.prompts))
    total_steps = args.prompts // 8 * STEPS_PER_ROUND
    hang_file = os.path.join(out, "hang_armed")
    server = RewardServer()
    ray.init(num_cpus=8, include_dashboard=False, logging_level="ERROR", log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.path.join(ROOT, "benchmarks") + os.pathsep + ROOT,
                                       "COATI_SOAK_HANG": hang_file},
                          "worker_process_setup_hook": "soak_faults.install"})
    run_dir = os.path.join(out, "soak")
    base = ["-d", data, "-i", "1", "-t", "2", "-ibs", "8", "-imbs", "8", "-g", "4", "-tbs", "2", "-tMbs", "2",
            "-tmbs", "8", "-e", "1", "-si", "2", "--wait-scale", "0.05", "--reward-url", server.url,
            "--reward-url-timeout", "2", "--reward-url-retries", "4", "-sd", out, "-p", "soak", "--no-progress"]
    faults = Faults(run_dir, server, hang_file, total_steps)
    faults.start()
    segments = []  # (its rollout dir, the last step it counts: the checkpoint the next one continued from)
    resume: list[str] = []
    while True:
        rollouts = os.path.join(out, f"rollouts_{len(segments)}")
        config = config_from_args(build_parser().parse_args(base + resume + ["-rsd", rollouts]), assets)
        check_inputs(config)
        try:
            result = run(config, log=lambda line: print(line, flush=True))
        except RunStopped as err:
            stopped, (what, _, since) = time.time(), faults.done[-1]
            if what.startswith("hang") and os.path.isfile(hang_file + ".began"):  # when the rank began hanging
                with open(hang_file + ".began") as handle:
                    since = float(handle.read())
            newest = list_checkpoints(run_dir)[-1][0]
            print(f"soak: the run stopped {stopped - since:.1f} s after '{what}': {err}", flush=True)
            segments.append((rollouts, newest))
            resume = ["--resume", "latest"]
            continue
        segments.append((rollouts, result.steps))
        break
    faults.stop_event.set()
    server.stop()
    ray.shutdown()

    counts, lower = Counter(), 0
    for rollouts, upto in segments:
        counts += trained_prompt_counts(os.path.join(rollouts, "soak"), range(lower + 1, upto + 1))
        lower = upto
    steps = train_steps(run_dir)
    once = sum(1 for n in counts.values() if n == 1)
    twice = sum(1 for n in counts.values() if n > 1)
    missing = args.prompts - len(counts)
    step_counts = Counter(steps)
    each_step_once = all(n == 1 for n in step_counts.values())
    no_step_missing = sorted(step_counts) == list(range(1, total_steps + 1))
    print(f"soak: {len(segments)} segments, faults {[f'{what} after step {step}' for what, step, _ in faults.done]}, "
          f"{time.time() - start:.0f} s")
    print(f"soak: prompts trained once {once} of {args.prompts}, more than once {twice}, never {missing}; "
          f"steps {min(steps)}-{max(steps)}: each once {each_step_once}, none missing {no_step_missing}")
    ok = once == args.prompts and each_step_once and no_step_missing and len(faults.done) == len(faults.schedule)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
