"""Step metrics of multi-turn episodes (groups with ``turns``); nothing for single-turn groups."""

from __future__ import annotations

from coati.rollout.group import RolloutGroup


def episode_metrics(groups: list[RolloutGroup]) -> dict[str, float]:
    """Turns and tool calls per episode, the share of episodes that called a tool, failed and timed-out calls
    per call, the fraction of response tokens the environment wrote, and the mean reward by number of calls
    (``reward_calls_0``, ``_1``, ``_2plus``; absent when no episode made that many)."""
    episodes = [(g, i) for g in groups if g.turns for i in range(len(g.responses))]
    if not episodes:
        return {}
    calls, errors, timeouts, turns, env_tokens, tokens = 0, 0, 0, 0, 0, 0
    by_calls: dict[str, list[float]] = {}
    for group, i in episodes:
        records = group.turns[i]
        made = sum("tool_call" in t for t in records)
        calls, turns = calls + made, turns + len(records)
        errors += sum(bool(t.get("tool_error")) for t in records)
        timeouts += sum(bool(t.get("tool_timeout")) for t in records)
        mask = group.loss_mask(i)
        env_tokens, tokens = env_tokens + len(mask) - sum(mask), tokens + len(mask)
        by_calls.setdefault("2plus" if made >= 2 else str(made), []).append(group.rewards[i])
    n = len(episodes)
    metrics = {"episode_turns": turns / n, "tool_calls": calls / n,
               "tool_use_rate": sum(any("tool_call" in t for t in g.turns[i]) for g, i in episodes) / n,
               "tool_error_rate": errors / max(calls, 1), "tool_timeout_rate": timeouts / max(calls, 1),
               "tool_token_fraction": env_tokens / max(tokens, 1)}
    for key, rewards in sorted(by_calls.items()):
        metrics[f"reward_calls_{key}"] = sum(rewards) / len(rewards)
    return metrics
