"""PNG plots of a run's metrics.jsonl: training curves and held-out evaluation curves over steps.

``python -m coati.plot RUN_DIR`` writes ``RUN_DIR/plots/train.png`` and, when the run has evaluations,
``RUN_DIR/plots/eval.png``. Panels are chosen by the metrics the rows have (``choose_panels``): GRPO's policy
curves, an RM stage's held-out pairwise accuracy, and a PPO run's critic (value loss, explained variance, clipped
value fraction), KL penalty (KL per token, its coefficient) and reward-model scores (training rollouts; eval rows'
``rm_score``). Run-health warnings (rows of kind "health") get a panel of their own, one line per monitor, and a
dashed red line at their step on the panel of the metric they read (the row's ``metric``; ``eval/<key>`` for
an eval panel's).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict

# What to draw from the training rows, in panel order; panels whose key never appears are left out, so a GRPO
# run draws no critic panels and a PPO run (critic, reward model, KL in the reward) draws them beside its own.
TRAIN_PANELS = (
    ("reward", "mean reward"),
    ("rm_score", "reward-model score of rollouts (mean)"),
    ("accuracy", "rollout accuracy"),
    ("loss", "policy loss"),
    ("entropy", "policy entropy (per token)"),
    ("value_loss", "critic value loss"),
    ("explained_variance", "critic explained variance"),
    ("value_clip_fraction", "clipped value fraction"),
    ("kl", "KL to reference (per token)"),
    ("kl_coef", "KL coefficient (beta)"),
    ("response_length", "response length (tokens)"),
    ("clip_fraction", "clipped token fraction"),
    ("grad_norm", "gradient norm"),
    ("truncation_rate", "truncated responses"),
    ("staleness_mean", "staleness of trained groups (versions)"),
    ("mismatch_k3", "behaviour vs trainer logprobs (k3)"),
    ("is_truncated", "importance weights capped (fraction)"),
)
# Metrics of the eval rows (kind "eval", one curve per task / mode): the verifiable accuracy of GRPO/PPO evals
# (absent when no reward of the run defines correctness), their mean reward, an RM stage's held-out pairwise
# accuracy; the reward model's mean score of a PPO run's eval responses.
EVAL_PANELS = (
    ("accuracy", "held-out accuracy"),
    ("mean_reward", "held-out mean reward"),  # what a run whose rewards define no correctness reports instead
    ("rm_score", "held-out reward-model score (mean)"),
)


HEALTH_PANEL = ("health", "run-health warnings")


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


def _numeric(row: dict, key: str) -> bool:
    return isinstance(row.get(key), (int, float)) and not isinstance(row.get(key), bool)


def choose_panels(rows: list[dict]) -> dict[str, list[tuple[str, str]]]:
    """{"train": [(key, title)], "eval": [(key, title)]}: the panels of TRAIN_PANELS / EVAL_PANELS that some
    row of that kind has a number for (an SFT stage's eval rows have a loss only: no eval panel)."""
    train = [r for r in rows if r.get("kind", "train") == "train"]
    evals = [r for r in rows if r.get("kind") == "eval"]
    health = [HEALTH_PANEL] if any(r.get("kind") == "health" for r in rows) else []
    return {"train": [(key, title) for key, title in TRAIN_PANELS if any(_numeric(r, key) for r in train)] + health,
            "eval": [(key, title) for key, title in EVAL_PANELS if any(_numeric(r, key) for r in evals)]}


def health_marks(rows: list[dict]) -> dict[str, list[tuple[int, str]]]:
    """metric -> [(step, monitor)] of the run-health warnings, the step being the last one the warning covers."""
    marks: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for row in rows:
        if row.get("kind") == "health":
            marks[row.get("metric", "reward")].append((row.get("last_step", row["step"]), row.get("monitor", "?")))
    return marks


def _mark(ax, marks: list[tuple[int, str]]) -> None:
    for step, monitor in marks:
        ax.axvline(step, color="tab:red", linestyle="--", linewidth=1, alpha=0.7)
        ax.annotate(monitor, (step, 0.98), xycoords=("data", "axes fraction"), rotation=90, va="top", ha="right",
                    fontsize=7, color="tab:red")


def _draw_health(ax, rows: list[dict]) -> None:
    """One line per monitor: each warning's steps (first to last) and a cross at its last."""
    warnings = [r for r in rows if r.get("kind") == "health"]
    names = sorted({r.get("monitor", "?") for r in warnings})
    for row in warnings:
        y = names.index(row.get("monitor", "?"))
        last = row.get("last_step", row["step"])
        ax.plot([row.get("first_step", last), last], [y, y], color="tab:red", linewidth=3, alpha=0.5)
        ax.plot([last], [y], marker="x", color="tab:red")
    ax.set_yticks(range(len(names)), names)
    ax.set_ylim(-0.5, len(names) - 0.5)


def _grid(plt, count: int, cols: int, height: float):
    cols = min(cols, count)
    rows = (count + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols + 0.5, height * rows), squeeze=False)
    for ax in list(axes.flat)[count:]:
        ax.axis("off")
    return fig, list(axes.flat)


def plot_run(run_dir: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(run_dir)
    panels = choose_panels(rows)
    out_dir = os.path.join(run_dir, "plots")
    os.makedirs(out_dir, exist_ok=True)
    written = []
    train = [r for r in rows if r.get("kind", "train") == "train"]
    marks = health_marks(rows)
    if panels["train"]:
        fig, axes = _grid(plt, len(panels["train"]), 2, 2.8)
        window = max(1, len(train) // 20)
        for ax, (key, title) in zip(axes, panels["train"]):
            if (key, title) == HEALTH_PANEL:
                _draw_health(ax, rows)
            else:
                steps, values = zip(*[(r["step"], r[key]) for r in train if _numeric(r, key)])
                ax.plot(steps, values, color="tab:blue", alpha=0.3, linewidth=1)
                ax.plot(steps, _smooth(list(values), window), color="tab:blue", linewidth=2)
                _mark(ax, marks.get(key, []))
            ax.set_title(title)
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
        fig.suptitle(f"training: {os.path.basename(os.path.abspath(run_dir))}")
        fig.tight_layout()
        written.append(os.path.join(out_dir, "train.png"))
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)
    if panels["eval"]:
        fig, axes = _grid(plt, len(panels["eval"]), 2, 4.0)
        for ax, (key, title) in zip(axes, panels["eval"]):
            curves: dict[str, list[tuple[int, float]]] = defaultdict(list)
            for row in rows:
                if row.get("kind") == "eval" and _numeric(row, key):
                    curves[f"{row.get('task', 'eval')} / {row.get('mode', '')}"].append((row["step"], row[key]))
            for label, points in sorted(curves.items()):
                steps, values = zip(*sorted(points))
                ax.plot(steps, values, marker="o", label=label)
            _mark(ax, marks.get(f"eval/{key}", []))
            ax.set_title(title)
            ax.set_xlabel("step")
            if key == "accuracy":
                ax.set_ylim(0, 1)
            ax.grid(alpha=0.3)
            ax.legend()
        fig.tight_layout()
        written.append(os.path.join(out_dir, "eval.png"))
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)
    return written


def main(argv: list[str] | None = None, prog: str = "python -m coati.plot") -> int:
    from coati.utils.flag_parser import FlagParser

    parser = FlagParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", help="a run directory: <save-dir>/<project>")
    args = parser.parse_args(argv)
    try:
        for path in plot_run(args.run_dir):
            print(path)
    except PlotError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0
