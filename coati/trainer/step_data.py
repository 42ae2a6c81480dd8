"""What one training step reads off its groups besides the loss: each data-parallel rank's share, and the
rollout metrics of the groups drawn (pure functions of the groups)."""

from __future__ import annotations

from coati.rollout.episode_metrics import episode_metrics
from coati.rollout.group import RolloutGroup


def share_bounds(count: int, parts: int, index: int) -> tuple[int, int]:
    """[start, end) of part ``index`` when ``count`` items are split into ``parts`` contiguous, balanced parts."""
    base, extra = divmod(count, parts)
    start = index * base + min(index, extra)
    return start, start + base + (index < extra)


def rollout_metrics(groups: list[RolloutGroup], current_version: int) -> dict:
    rewards = [r for g in groups for r in g.rewards]
    lengths = [len(r) for g in groups for r in g.responses]
    n = max(len(rewards), 1)
    return {
        "reward": sum(rewards) / n,
        "accuracy": sum(c for g in groups for c in g.correct) / n,
        "format_rate": sum(f for g in groups for f in g.format_ok) / n,
        "response_length": sum(lengths) / n,
        "truncation_rate": sum(f == "length" for g in groups for f in g.finish_reasons) / n,
        "policy_lag": current_version - min((g.policy_version for g in groups), default=current_version),
        # producer seconds that made these groups (generation and scoring run beside training in async mode)
        "generate_s": sum(g.generate_s for g in groups),
        "score_s": sum(g.score_s for g in groups),
        **episode_metrics(groups),  # multi-turn episodes only
    }
