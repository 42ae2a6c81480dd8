"""--health: the run-health monitors' thresholds (coati/launcher/health.py), one field each with its default and
meaning. The flag takes ``key=value,...`` (a key left out keeps its default; 0 turns that monitor off) or ``off``
(every monitor, the equal-rewards warning of --equal-reward-steps too). A new threshold is one field here.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from coati.config.errors import ConfigError
from coati.utils.dataclass_cli import did_you_mean, doc_of, setting

OFF = "off"


@dataclass(frozen=True)
class HealthSettings:
    window: int = setting(5, "steps a monitor averages over (the length's baseline is the run's first window; "
                             "a gradient spike is measured against the median of the 4 windows before it)")
    quiet_steps: int = setting(100, "after a warning the same monitor stays quiet for this many steps")
    entropy_min: float = setting(0.05, "entropy collapse: the policy's mean entropy (nats per token) falls below this")
    length_ratio: float = setting(3.0, "length drift: the mean response length is this many times the first "
                                       "window's, or that many times shorter (0 or > 1)")
    truncation: float = setting(0.4, "truncation: this share of the responses (0-1) hit the -mnt limit")
    kl_max: float = setting(0.1, "KL rising: the KL to the reference (per token; the loss's -kl term or PPO's "
                                 "penalty) is above this and higher than in the window before")
    grad_spike: float = setting(5.0, "gradient spike: one step's gradient norm is this many times the median before")
    dominance: float = setting(0.9, "one reward dominating: one reward's share (0-1) of the summed |weight x score| "
                                    "of a run with several weighted rewards")
    eval_drop: float = setting(0.1, "eval falling: a held-out accuracy (mean reward where accuracy is not defined) "
                                    "falls this far (and beyond chance for its prompt count) below its best while the training "
                                    "reward rises")
    reward_rise: float = setting(0.05, "eval falling: how much the training reward (mean over a window) must have "
                                       "risen since that best evaluation")


def health_help() -> str:
    keys = "; ".join(f"{f.name} ({f.default:g}): {doc_of(f)}" for f in dataclasses.fields(HealthSettings))
    return (f"run-health monitors' thresholds as key=value,... (a key left out keeps its default; 0 turns that "
            f"monitor off), or '{OFF}': no monitor at all, the equal-rewards warning included. Keys (default): {keys}")


def parse_health(text: str | None) -> HealthSettings | None:
    """--health's text -> its settings; None: ``off``. A bad item is one ConfigError line."""
    if text is not None and text.strip() == OFF:
        return None
    fields = {f.name: f for f in dataclasses.fields(HealthSettings)}
    values: dict[str, float] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        key, sep, raw = (part.strip() for part in item.partition("="))
        if key not in fields:
            raise ConfigError(f"--health: unknown key {key!r}{did_you_mean(key, fields)}; keys: {', '.join(fields)} "
                              f"(or --health {OFF})")
        kind = type(fields[key].default)
        try:
            value = kind(raw) if sep else math.nan
        except ValueError:
            value = math.nan
        if not sep or not math.isfinite(value) or value < 0:
            raise ConfigError(f"--health {key}: needs a number >= 0 ({kind.__name__}), as {key}=VALUE; got "
                              f"{item.strip()!r}")
        values[key] = value
    settings = HealthSettings(**values)
    _check(settings)
    return settings


def _check(s: HealthSettings) -> None:
    problems = [(s.window >= 1, f"window must be at least 1, got {s.window}"),
                (s.length_ratio == 0 or s.length_ratio > 1,
                 f"length_ratio must be 0 (off) or > 1, got {s.length_ratio:g}"),
                (s.truncation <= 1, f"truncation is a share of the responses, 0-1, got {s.truncation:g}"),
                (s.dominance <= 1, f"dominance is a share of the reward, 0-1, got {s.dominance:g}")]
    for ok, message in problems:
        if not ok:
            raise ConfigError(f"--health {message}")
