"""What one training step reads off its groups besides the loss: each data-parallel rank's share, the rollout
metrics of the groups drawn (pure functions of the groups), and what a step trains on (``StepWork``)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from coati.rollout.episode_metrics import episode_metrics
from coati.rollout.group import RolloutGroup
from rewards.correctness import accuracy


def share_bounds(count: int, parts: int, index: int) -> tuple[int, int]:
    """[start, end) of part ``index`` when ``count`` items are split into ``parts`` contiguous, balanced parts."""
    base, extra = divmod(count, parts)
    start = index * base + min(index, extra)
    return start, start + base + (index < extra)


def rollout_metrics(groups: list[RolloutGroup], current_version: int) -> dict:
    rewards = [r for g in groups for r in g.rewards]
    lengths = [len(r) for g in groups for r in g.responses]
    n = max(len(rewards), 1)
    rate = accuracy(c for g in groups for c in g.correct)
    return {
        "reward": sum(rewards) / n,
        **({"accuracy": rate} if rate is not None else {}),  # absent: no reward of the run defines correctness
        **equal_reward_metrics(groups),
        "format_rate": sum(f for g in groups for f in g.format_ok) / n,
        "response_length": sum(lengths) / n,
        "truncation_rate": sum(f == "length" for g in groups for f in g.finish_reasons) / n,
        "policy_lag": current_version - min((g.policy_version for g in groups), default=current_version),
        # producer seconds that made these groups (generation and scoring run beside training in async mode)
        "generate_s": sum(g.generate_s for g in groups),
        "score_s": sum(g.score_s for g in groups),
        **episode_metrics(groups),  # multi-turn episodes only
        **reward_part_metrics(groups),  # several weighted rewards only
    }


def reward_part_metrics(groups: list[RolloutGroup]) -> dict:
    """``reward_parts``: each reward's mean own score (before weighting) over the samples, by its name (its named
    sub-parts and verdicts left out), where the run has several rewards; the health monitor of one reward
    dominating the sum weighs them."""
    parts = [p for g in groups for p in g.reward_parts]
    sums: dict[str, float] = {}
    for part in parts:
        for name, score in part.items():
            if "/" not in name and isinstance(score, (int, float)) and not isinstance(score, bool):
                sums[name] = sums.get(name, 0.0) + score
    return {"reward_parts": {name: total / len(parts) for name, total in sums.items()}} if sums else {}


def equal_reward_metrics(groups: list[RolloutGroup]) -> dict:
    """Groups of several samples (``reward_groups``) and those among them whose samples all got the same reward
    (``equal_reward_groups``: a group-relative advantage of 0 everywhere, nothing to learn), the rewards those
    share (``equal_reward_values``, a few), and the built-in reward's reasons over all samples (``reasons``)."""
    several = [g for g in groups if len(g.rewards) > 1]
    equal = [g for g in several if max(g.rewards) == min(g.rewards)]
    reasons = Counter(reason for g in groups for reason in g.reasons)
    return {"reward_groups": len(several), "equal_reward_groups": len(equal),
            "equal_reward_values": sorted({round(g.rewards[0], 4) for g in equal})[:5],
            **({"reasons": dict(reasons.most_common())} if reasons else {})}


@dataclass
class StepWork:
    """What one step trains on: this rank's ``share`` of the step's ``kept`` units (whole groups, or sample views
    of a round's part: coati.trainer.round_batches) with ``padding`` placeholders at its end, the round's
    per-sample tensors behind them (``rows``; None for whole groups), and what the step's metrics report:
    draw counters and rollout metrics (``info``), the trained groups' staleness, prompts and samples seen, and
    the groups the rollout log records (``drawn`` and ``groups``: empty at a round's later steps; they cover
    ``log_steps`` steps). An SFT/RM stage's units are its task's tokenised rows, with nothing else to report
    (supervised.py)."""
    share: list[RolloutGroup]
    kept: list[RolloutGroup]
    padding: int
    info: dict = field(default_factory=dict)
    staleness: list[int] = field(default_factory=list)
    prompts: int = 0
    samples: int = 0
    rows: object = None
    drawn: list[RolloutGroup] = field(default_factory=list)
    groups: list[RolloutGroup] = field(default_factory=list)
    log_steps: int = 1
