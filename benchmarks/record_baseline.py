"""Runs a demo as a user would and appends its held-out result to the baseline table of docs/results.md.

    .venv/bin/python benchmarks/record_baseline.py --demo addition    # rl_example.py, no arguments
    .venv/bin/python benchmarks/record_baseline.py --demo smollm2     # rl_example.py --demo smollm2
    .venv/bin/python benchmarks/record_baseline.py --demo gemma3      # rl_example.py --demo gemma3
    ... --dry  # print the row instead of writing it

The row: date, commit, machine (CPU model, usable cores), steps, minutes from start to the summary, and each
held-out line of the summary (before -> after). Run it on a quiet machine: minutes are wall-clock.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "docs", "results.md")
TABLE_HEADER = "| date | commit | machine | demo | steps | minutes | held-out before -> after |"
DEMOS = {"addition": [], "smollm2": ["--demo", "smollm2"], "gemma3": ["--demo", "gemma3"]}
_SUMMARY = re.compile(r"^held-out (?:accuracy|mean reward|\w[\w ]*) (\S+): (-?[\d.]+) -> (-?[\d.]+)")
_TRAINED = re.compile(r"^trained (\d+) steps")


def machine() -> str:
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as handle:
            model = next(line.split(":", 1)[1].strip() for line in handle if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{model}, {cores} cores"


def commit() -> str:
    found = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()
    return (found.stdout.strip() or "unknown") + ("+changes" if dirty else "")


def parse_summary(output: str) -> tuple[int, list[str]]:
    """(steps trained, ["task/mode: before -> after", ...]) from a run's printed summary."""
    steps, results = None, []
    for line in output.splitlines():
        if match := _TRAINED.match(line):
            steps = int(match.group(1))
        elif match := _SUMMARY.match(line):
            results.append(f"{match.group(1)}: {match.group(2)} -> {match.group(3)}")
    if steps is None or not results:
        raise ValueError("the run printed no summary (trained N steps / held-out ... lines)")
    return steps, results


def row(demo: str, steps: int, minutes: float, results: list[str]) -> str:
    return (f"| {datetime.date.today().isoformat()} | {commit()} | {machine()} | {demo} | {steps} | {minutes:.1f} | "
            f"{'; '.join(results)} |")


def append_row(text: str, path: str = RESULTS) -> None:
    """Adds ``text`` as the last row of the table headed TABLE_HEADER."""
    with open(path, encoding="utf-8") as handle:
        lines = handle.read().splitlines()
    if TABLE_HEADER not in lines:
        raise ValueError(f"{path} has no table headed {TABLE_HEADER!r}")
    end = lines.index(TABLE_HEADER) + 2  # header and its rule
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    lines.insert(end, text)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--demo", choices=tuple(DEMOS), required=True)
    parser.add_argument("--dry", action="store_true", help="print the row, do not write docs/results.md")
    parser.add_argument("extra", nargs="*", help="more rl_example.py flags (after --)")
    args = parser.parse_args(argv)
    start = time.time()
    done = subprocess.run([sys.executable, os.path.join(ROOT, "rl_example.py"), *DEMOS[args.demo], *args.extra],
                          cwd=ROOT, capture_output=True, text=True)
    minutes = (time.time() - start) / 60
    if done.returncode != 0:
        print(done.stdout[-2000:] + done.stderr[-2000:], file=sys.stderr)
        print(f"error: the {args.demo} demo exited {done.returncode}; no row written", file=sys.stderr)
        return 1
    steps, results = parse_summary(done.stdout)
    text = row(args.demo, steps, minutes, results)
    print(text)
    if not args.dry:
        append_row(text)
        print(f"appended to {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
