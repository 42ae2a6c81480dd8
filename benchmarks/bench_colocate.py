"""Colocated (`--colocate`) against decoupled sync (`-i 1 -t 1`) on the demo, side by side in one run.

Both layouts train the embedded demo on the same prompts with the same seeds (a colocated `-t 1` run samples what
the decoupled run samples: tests/trainer/test_colocated.py), alternating run by run so that a change of load on a
shared machine falls on both. Printed per layout: trainer steps per second (first to last step, from the metrics'
``time_s``), the mean seconds per step of each stage, the process tree's peak RSS of the run (driver and every
actor: ``ru_maxrss`` of children is not enough under Ray, so a sampler reads /proc every 0.2 s), the held-out
sampled accuracy at every ``--eval-every`` steps and the first step reaching ``--target``; then colocated /
decoupled ratios.

    python benchmarks/bench_colocate.py                     # 1 episode (64 steps), 2 runs of each layout
    python benchmarks/bench_colocate.py --episodes 3 --repeats 1 --eval-every 16

The load average is printed before and after: on a shared machine it bounds what the ratios mean.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

LAYOUTS = {"decoupled": ["-i", "1", "-t", "1"], "colocated": ["--colocate"]}
STAGES = ("generate_s", "buffer_wait_s", "train_s", "publish_s", "step_time_s")


def load() -> str:
    return "load average " + ", ".join(f"{value:.2f}" for value in os.getloadavg())


class TreeRss:
    """Peak of the summed RSS of this process and all its descendants, sampled in a thread."""

    def __init__(self, period_s: float = 0.2):
        self.period_s, self.peak, self._stop = period_s, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        import psutil

        root = psutil.Process()
        while not self._stop.is_set():
            total = 0
            for proc in [root, *root.children(recursive=True)]:
                try:
                    total += proc.memory_info().rss
                except psutil.Error:
                    pass
            self.peak = max(self.peak, total)
            self._stop.wait(self.period_s)


def train(layout: str, episodes: int, eval_every: int, out_dir: str, demo) -> dict:
    import ray

    from coati.config.cli import build_parser, config_from_args
    from coati.launcher.rl import run

    parser = build_parser()
    args = parser.parse_args([*LAYOUTS[layout], "-e", str(episodes), "-ei", str(eval_every), "-si", "0",
                              "--no-progress", "-sd", out_dir, "-p", layout])
    config = config_from_args(args, demo, given=parser.given)
    with TreeRss() as rss:
        try:
            result = run(config, log=lambda message: None)
        finally:
            ray.shutdown()
    rows = [json.loads(line) for line in open(result.metrics_path)]
    steps = [row for row in rows if row["kind"] == "train"]
    evals = {row["step"]: row["accuracy"] for row in rows if row["kind"] == "eval" and row["mode"] == "sampled"}
    first, last = steps[0], steps[-1]
    return {"steps_per_s": (last["step"] - first["step"]) / (last["time_s"] - first["time_s"]),
            "stages": {name: sum(row.get(name, 0.0) for row in steps) / len(steps) for name in STAGES},
            "rss_gib": rss.peak / 2**30, "evals": evals}


def first_reaching(evals: dict, target: float) -> int | None:
    return next((step for step in sorted(evals) if evals[step] >= target), None)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--eval-every", type=int, default=16)
    parser.add_argument("--target", type=float, default=0.60)
    args = parser.parse_args(argv)
    from coati.demo.math_demo import ensure_demo_assets

    demo = ensure_demo_assets(log=lambda message: None)
    print(load())
    results: dict[str, list[dict]] = {name: [] for name in LAYOUTS}
    with tempfile.TemporaryDirectory() as out:
        for repeat in range(args.repeats):
            for layout in LAYOUTS:
                result = train(layout, args.episodes, args.eval_every, os.path.join(out, str(repeat)), demo)
                results[layout].append(result)
                stages = ", ".join(f"{k} {v:.3f}" for k, v in result["stages"].items())
                print(f"{layout} #{repeat}: {result['steps_per_s']:.3f} steps/s, peak RSS {result['rss_gib']:.2f} GiB "
                      f"(driver and actors), first step at held-out sampled >= {args.target}: "
                      f"{first_reaching(result['evals'], args.target)}; per step: {stages}", flush=True)
                print("  held-out sampled: " + ", ".join(f"{s}: {a:.3f}" for s, a in sorted(result["evals"].items())))
    mean = {name: sum(r["steps_per_s"] for r in runs) / len(runs) for name, runs in results.items()}
    rss = {name: max(r["rss_gib"] for r in runs) for name, runs in results.items()}
    print(f"colocated / decoupled: steps/s {mean['colocated'] / mean['decoupled']:.2f} "
          f"({mean['colocated']:.3f} vs {mean['decoupled']:.3f}), peak RSS {rss['colocated'] / rss['decoupled']:.2f} "
          f"({rss['colocated']:.2f} vs {rss['decoupled']:.2f} GiB)")
    print(load())


if __name__ == "__main__":
    main()
