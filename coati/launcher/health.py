"""Run-health monitors: small pure objects the driver feeds each step's metrics row, which return a warning when
the run is going nowhere, at once instead of after hours of flat curves.

A monitor (``feed(step, metrics) -> HealthWarning | None``) keeps its own streak and fires once when its condition
has held long enough; ``RunHealth`` holds a run's monitors and rate-limits them (a monitor that warned stays quiet
for ``quiet_steps`` steps), and the driver prints each warning as one line and logs it to metrics.jsonl as a row
of kind "health". A new monitor is one class here and one entry in ``run_monitors``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

from rewards.combine import parse_weights


@dataclass(frozen=True)
class HealthWarning:
    monitor: str  # which monitor: the "monitor" field of its metrics.jsonl row
    first_step: int
    last_step: int
    text: str  # the one line printed
    data: dict = field(default_factory=dict)  # what the row records besides the line

    def row(self) -> dict:
        return {"monitor": self.monitor, "first_step": self.first_step, "last_step": self.last_step,
                "message": self.text, **self.data}


class Monitor(Protocol):
    name: str

    def feed(self, step: int, metrics: dict) -> HealthWarning | None: ...


class RunHealth:
    """A run's monitors; each warns at most once per ``quiet_steps`` steps."""

    def __init__(self, monitors: list[Monitor], quiet_steps: int = 100):
        self.monitors, self.quiet_steps = monitors, quiet_steps
        self._last_warned: dict[str, int] = {}

    def feed(self, step: int, metrics: dict) -> list[HealthWarning]:
        warnings = []
        for monitor in self.monitors:
            warning = monitor.feed(step, metrics)
            last = self._last_warned.get(monitor.name)
            if warning is not None and (last is None or step - last >= self.quiet_steps):
                self._last_warned[monitor.name] = step
                warnings.append(warning)
        return warnings


def _percentages(counts: Counter, top: int = 3) -> str:
    total = sum(counts.values())
    shown = [f"{reason} {100 * count / total:.0f}%" for reason, count in counts.most_common(top)]
    rest = len(counts) - top
    return ", ".join(shown) + (f", {rest} more" if rest > 0 else "")


@dataclass
class EqualRewards:
    """Every group of several samples got equal rewards (``equal_reward_groups == reward_groups`` in the rollout
    metrics) for ``steps`` steps in a row: every group-relative advantage is 0 and the policy learns nothing. Fires
    once per streak, with the built-in reward's reasons counted over the streak and concrete things to try.
    ``reward_type``: the -rt name; ``builtin_weighted``: its weight is not 0; ``user_rewards``: --reward-fn or
    --reward-url given; ``group_size`` (-g) and ``temperature`` (-temp) as set."""
    steps: int
    reward_type: str
    builtin_weighted: bool
    user_rewards: bool
    group_size: int
    temperature: float
    name: str = "equal_rewards"
    _first: int | None = None
    _count: int = 0
    _values: set = field(default_factory=set)
    _reasons: Counter = field(default_factory=Counter)

    def feed(self, step: int, metrics: dict) -> HealthWarning | None:
        groups = metrics.get("reward_groups", 0)
        if not groups:  # no group of several samples this step (e.g. a later step of a short round): no evidence
            return None
        if metrics.get("equal_reward_groups", 0) < groups:
            self._first, self._count, self._values, self._reasons = None, 0, set(), Counter()
            return None
        if self._first is None:
            self._first = step
        self._count += 1
        self._values.update(metrics.get("equal_reward_values", ()))
        self._reasons.update(metrics.get("reasons", {}))
        if self._count != self.steps:
            return None
        values = ", ".join(f"{v:g}" for v in sorted(self._values)[:3]) or "?"
        reasons = _percentages(self._reasons) if self._reasons else "not recorded"
        # at weight 0 the built-in reasons explain nothing of the reward: say whose they are
        whose = "Reasons" if self.builtin_weighted else f"The built-in {self.reward_type} verdicts (weighted 0)"
        text = (f"warning: steps {self._first}-{step}: every group's rewards are equal (all {values}): nothing to "
                f"learn. {whose}: {reasons}. Try: {'; '.join(self.suggestions())}")
        return HealthWarning(self.name, self._first, step, text,
                             {"values": sorted(self._values), "reasons": dict(self._reasons.most_common())})

    def suggestions(self) -> list[str]:
        if self.builtin_weighted and set(self._reasons) == {"ok"}:
            return ["harder prompts: every sample is already right",
                    f"more samples per prompt (-g, now {self.group_size}) to find the rare miss"]
        tips = []
        if self.builtin_weighted:
            tips.append(f"a system prompt (-s) that asks for the format -rt {self.reward_type} checks "
                        "(docs/rewards.md)")
        if not self.user_rewards:
            tips.append(f"your own graded reward: --reward-fn file.py:fn --reward-weights {self.reward_type}:0")
        else:
            tips.append("a reward of your own (--reward-fn, --reward-url) that scores the samples of a prompt apart "
                        "(rollout logs, -rsd, show each part)")
        tips.append(f"more samples per prompt (-g, now {self.group_size})")
        tips.append(f"a higher temperature (-temp, now {self.temperature:g})")
        return tips


def run_monitors(config) -> RunHealth:
    """The monitors of an RL run, as its config asks (``--equal-reward-steps 0`` turns that one off)."""
    d = config.data
    monitors: list[Monitor] = []
    if config.run.equal_reward_steps > 0:
        monitors.append(EqualRewards(
            steps=config.run.equal_reward_steps, reward_type=d.reward_type,
            builtin_weighted=parse_weights(d.reward_weights).get(d.reward_type, 1.0) != 0,
            user_rewards=bool(d.reward_fn or d.reward_url), group_size=config.batch.num_generations,
            temperature=config.sampling.temperature))
    return RunHealth(monitors)
