"""PNG plots of a run's metrics.jsonl: training curves and held-out evaluation curves over steps.

``python -m coati.plot RUN_DIR`` writes ``RUN_DIR/plots/train.png`` and, when the run has evaluations,
``RUN_DIR/plots/eval.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict

# What to draw from the training rows, in panel order; panels whose key never appears are left out.
TRAIN_PANELS = (
    ("reward", "mean reward"),
    ("accuracy", "rollout accuracy"),
    ("loss", "policy loss"),
    ("kl", "KL to reference"),
    ("response_length", "response length (tokens)"),
    ("clip_fraction", "clipped token fraction"),
    ("grad_norm", "gradient norm"),
    ("truncation_rate", "truncated responses"),
    ("staleness_mean", "staleness of trained groups (versions)"),
    ("mismatch_k3", "behaviour vs trainer logprobs (k3)"),
    ("is_truncated", "importance weights capped (fraction)"),
)


class PlotError(ValueError):
    pass


def read_metrics(run_dir: str) -> list[dict]:
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        raise PlotError(f"{path} not found: pass the run directory (<save-dir>/<project>) of a training run")
    rows = []
    with open(path, encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    raise PlotError(f"{path}:{line_no}: not valid JSON") from None
    if not rows:
        raise PlotError(f"{path} has no rows yet")
    return rows


def _smooth(values: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def plot_run(run_dir: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(run_dir)
    out_dir = os.path.join(run_dir, "plots")
    os.makedirs(out_dir, exist_ok=True)
    written = []
    train = [r for r in rows if r.get("kind", "train") == "train"]
    panels = [(key, title) for key, title in TRAIN_PANELS if any(key in r for r in train)]
    if panels:
        cols = 2
        fig, axes = plt.subplots((len(panels) + cols - 1) // cols, cols, figsize=(11, 2.8 * ((len(panels) + 1) // 2)),
                                 squeeze=False)
        window = max(1, len(train) // 20)
        for ax, (key, title) in zip(axes.flat, panels):
            points = [(r["step"], r[key]) for r in train if isinstance(r.get(key), (int, float))]
            steps, values = zip(*points)
            ax.plot(steps, values, color="tab:blue", alpha=0.3, linewidth=1)
            ax.plot(steps, _smooth(list(values), window), color="tab:blue", linewidth=2)
            ax.set_title(title)
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
        for ax in list(axes.flat)[len(panels):]:
            ax.axis("off")
        fig.suptitle(f"training: {os.path.basename(os.path.abspath(run_dir))}")
        fig.tight_layout()
        written.append(os.path.join(out_dir, "train.png"))
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)
    curves: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for row in rows:
        if row.get("kind") == "eval" and "accuracy" in row:  # an SFT stage's eval rows have a loss only
            curves[f"{row.get('task', 'eval')} / {row.get('mode', '')}"].append((row["step"], row["accuracy"]))
    if curves:
        fig, ax = plt.subplots(figsize=(7, 4))
        for label, points in sorted(curves.items()):
            steps, values = zip(*sorted(points))
            ax.plot(steps, values, marker="o", label=label)
        ax.set_xlabel("step")
        ax.set_ylabel("held-out accuracy")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        written.append(os.path.join(out_dir, "eval.png"))
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)
    return written


def main(argv: list[str] | None = None, prog: str = "python -m coati.plot") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", help="a run directory: <save-dir>/<project>")
    args = parser.parse_args(argv)
    try:
        for path in plot_run(args.run_dir):
            print(path)
    except PlotError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0
