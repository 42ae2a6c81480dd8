"""Run-health monitors: small pure objects the driver feeds each step's metrics row, which return a warning when
the run is going nowhere, at once instead of after hours of flat curves.

A monitor (``feed(step, metrics) -> HealthWarning | None``) keeps its own streak or window and fires once when its
condition starts to hold; ``RunHealth`` holds a run's monitors and rate-limits them (a monitor that warned stays
quiet for ``quiet_steps`` steps), and the driver prints each warning as one line and logs it to metrics.jsonl as a
row of kind "health". The driver feeds every training (and skipped) row, and every evaluation row marked
``"kind": "eval"``; a monitor reads only the rows that hold its metric. A warning names ``metric``, the key of the
rows it read, so that ``coati plot`` marks it on that panel. A new monitor is one class here and one entry in
``run_monitors`` (``stage_monitors``: those that apply to the SFT/RM stages); its threshold is one field of
``HealthSettings`` (coati/config/health.py, ``--health``).
"""

from __future__ import annotations

import statistics
from collections import Counter, deque
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
    # the key of the rows the monitor read ("eval/<key>" for evaluation rows): the coati plot panel that marks it
    metric: str = "reward"

    def row(self) -> dict:
        return {"monitor": self.monitor, "metric": self.metric, "first_step": self.first_step,
                "last_step": self.last_step, "message": self.text, **self.data}


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
    --reward-url given (``user_reward_names``: their names, which the warning names when the built-in reward does
    not count); ``group_size`` (-g) and ``temperature`` (-temp) as set."""
    steps: int
    reward_type: str
    builtin_weighted: bool
    user_rewards: bool
    group_size: int
    temperature: float
    user_reward_names: tuple[str, ...] = ()
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
        # at weight 0 a record's reason is the weighted rewards' verdict (rewards/combine.unweighted_builtin)
        whose = "Reasons" if self.builtin_weighted else "Verdicts of the weighted rewards"
        yours = f"{self._yours()} gave every sample of a prompt the same score. " \
            if self.user_reward_names and not self.builtin_weighted else ""
        text = (f"warning: steps {self._first}-{step}: every group's rewards are equal (all {values}): nothing to "
                f"learn. {yours}{whose}: {reasons}. Try: {'; '.join(self.suggestions())}")
        return HealthWarning(self.name, self._first, step, text,
                             {"values": sorted(self._values), "reasons": dict(self._reasons.most_common())})

    def _yours(self) -> str:
        names = ", ".join("the reward server (--reward-url)" if name == "remote" else name
                          for name in self.user_reward_names)
        return f"your reward{'s' if len(self.user_reward_names) > 1 else ''} {names}"

    def suggestions(self) -> list[str]:
        if set(self._reasons) == ({"ok"} if self.builtin_weighted else {"correct"}):
            return ["harder prompts: every sample is already right",
                    f"more samples per prompt (-g, now {self.group_size}) to find the rare miss"]
        tips = []
        if self.builtin_weighted:
            tips.append(f"a system prompt (-s) that asks for the format -rt {self.reward_type} checks "
                        "(docs/rewards.md)")
        if not self.user_rewards:
            tips.append(f"your own graded reward: --reward-fn file.py:fn --reward-weights {self.reward_type}:0")
        elif self.user_reward_names:  # the flags are given: what to change is the reward they name
            tips.append(f"a version of {self._yours()} that scores the samples of a prompt apart (the rollout logs, "
                        "-rsd DIR, show each part's score per sample)")
        else:
            tips.append("a reward of your own (--reward-fn, --reward-url) that scores the samples of a prompt apart "
                        "(rollout logs, -rsd, show each part)")
        tips.append(f"more samples per prompt (-g, now {self.group_size})")
        tips.append(f"a higher temperature (-temp, now {self.temperature:g})")
        return tips


def _number(metrics: dict, key: str) -> float | None:
    """The training row's number under ``key``; None for an evaluation row and where the row has none (a skipped
    step has no loss metrics, a run without a reference model no KL)."""
    value = metrics.get(key)
    if metrics.get("kind") == "eval" or not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    return float(value)


class Recent:
    """The last ``size`` values a monitor was fed, with their steps, and the edge of its condition: a monitor
    fires when its condition starts to hold, and again only after it stopped holding."""

    def __init__(self, size: int):
        self.values: deque = deque(maxlen=size)
        self.steps: deque = deque(maxlen=size)
        self.holding = False

    def add(self, step: int, value) -> None:
        self.values.append(value)
        self.steps.append(step)

    @property
    def full(self) -> bool:
        return len(self.values) == self.values.maxlen

    def mean(self, values=None) -> float:
        values = self.values if values is None else values
        return sum(values) / len(values)

    def starts(self, holds: bool) -> bool:
        started = holds and not self.holding
        self.holding = holds
        return started


class Windowed:
    """A monitor of one number of the training rows (``metric``) over ``windows`` windows of its last values
    (``self._recent``): rows without the number neither count nor break them, and ``check(step, value)`` takes
    each value."""
    name = metric = ""
    windows = 1

    def __post_init__(self):
        self._recent = Recent(self.windows * self.window)

    def feed(self, step: int, metrics: dict) -> HealthWarning | None:
        value = _number(metrics, self.metric)
        return None if value is None else self.check(step, value)


@dataclass
class EntropyCollapse(Windowed):
    """The policy's entropy per token, averaged over ``window`` steps, fell below ``minimum``: sampling is nearly
    deterministic, so a prompt's samples stop differing and exploration ends."""
    minimum: float
    window: int
    temperature: float
    clip_eps_high: float
    learning_rate: float
    name = "entropy_collapse"
    metric = "entropy"
    _start = None  # the first window's mean

    def check(self, step: int, value: float) -> HealthWarning | None:
        recent = self._recent
        recent.add(step, value)
        if not recent.full:
            return None
        if self._start is None:
            self._start = recent.mean()
        mean = recent.mean()
        if not recent.starts(mean < self.minimum):
            return None
        tips = [f"a higher temperature (-temp, now {self.temperature:g})"]
        if self.clip_eps_high < 0.28:  # DAPO's clip-higher keeps rare tokens' probabilities rising
            tips.append(f"DAPO's clip-higher (--grpo-config '{{\"clip_eps_high\": 0.28}}', now {self.clip_eps_high:g})")
        tips.append(f"a lower learning rate (-lr, now {self.learning_rate:g})")
        text = (f"warning: steps {recent.steps[0]}-{step}: entropy collapse: the policy's entropy is {mean:.3g} nats "
                f"per token (mean of {self.window} steps; {self._start:.3g} over the run's first {self.window}), below "
                f"{self.minimum:g}: a prompt's samples stop differing and exploration ends. Try: {'; '.join(tips)}")
        return HealthWarning(self.name, recent.steps[0], step, text,
                             {"entropy": mean, "start": self._start, "bound": self.minimum}, self.metric)


@dataclass
class LengthDrift(Windowed):
    """The mean response length over ``window`` steps is ``ratio`` times that of the run's first ``window`` steps,
    or that many times shorter."""
    ratio: float
    window: int
    max_new_tokens: int
    name = "length_drift"
    metric = "response_length"

    def __post_init__(self):
        super().__post_init__()
        self._first = Recent(self.window)

    def check(self, step: int, value: float) -> HealthWarning | None:
        first, recent = self._first, self._recent
        if not first.full:  # the baseline: the run's first window, kept apart from the windows compared with it
            first.add(step, value)
            return None
        recent.add(step, value)
        base = first.mean()
        if not recent.full or base <= 0:
            return None
        mean = recent.mean()
        change = mean / base
        if not recent.starts(change >= self.ratio or change <= 1 / self.ratio):
            return None
        if change > 1:
            tips = ["read the rollouts (-rsd DIR) for repetition or padding that a reward pays for",
                    "a length penalty (--reward-fn)", f"a shorter cap (-mnt, now {self.max_new_tokens})"]
        else:
            tips = ["read the rollouts (-rsd DIR): answers that skip the work may still earn the reward",
                    "a reward that checks the steps you want"]
        text = (f"warning: steps {recent.steps[0]}-{step}: response length drift: {mean:.1f} tokens on average, "
                f"{change:.2f}x the {base:.1f} of steps {first.steps[0]}-{first.steps[-1]} (the bound: "
                f"{self.ratio:g}x either way). Try: {'; '.join(tips)}")
        return HealthWarning(self.name, recent.steps[0], step, text,
                             {"length": mean, "baseline": base, "ratio": change, "bound": self.ratio}, self.metric)


@dataclass
class Truncation(Windowed):
    """At least ``rate`` of the responses, averaged over ``window`` steps, hit the -mnt limit (finish reason
    "length"): a cut-off response has no final answer to reward."""
    rate: float
    window: int
    max_new_tokens: int
    name = "truncation"
    metric = "truncation_rate"

    def check(self, step: int, value: float) -> HealthWarning | None:
        recent = self._recent
        recent.add(step, value)
        if not recent.full or not recent.starts(recent.mean() >= self.rate):
            return None
        mean = recent.mean()
        text = (f"warning: steps {recent.steps[0]}-{step}: {mean:.0%} of the responses hit the -mnt limit of "
                f"{self.max_new_tokens} tokens (mean of {self.window} steps; the bound: {self.rate:.0%}): a cut-off "
                f"response has no final answer to reward. Try: a larger -mnt (now {self.max_new_tokens}); a system "
                "prompt (-s) that asks for shorter answers; DAPO's overlong filter (--grpo-config "
                "'{\"filter_truncated_response\": true}')")
        return HealthWarning(self.name, recent.steps[0], step, text, {"rate": mean, "bound": self.rate}, self.metric)


@dataclass
class KLRising(Windowed):
    """The KL to the reference per token (``kl``: the loss's KL term, or PPO's penalty), averaged over ``window``
    steps, is above ``bound`` and higher than over the ``window`` steps before: the policy keeps moving away from
    where it started."""
    bound: float
    window: int
    coef_flag: str  # the flag of the run's KL coefficient
    coef: float
    learning_rate: float
    name = "kl_rising"
    metric = "kl"
    windows = 2  # the window compared, and the one before it

    def check(self, step: int, value: float) -> HealthWarning | None:
        recent = self._recent
        recent.add(step, value)
        if not recent.full:
            return None
        values = list(recent.values)
        before, now = recent.mean(values[:self.window]), recent.mean(values[self.window:])
        if not recent.starts(now > self.bound and now > before):
            return None
        first = recent.steps[self.window]
        text = (f"warning: steps {first}-{step}: KL to the reference rising: {now:.3g} per token (mean of "
                f"{self.window} steps), up from {before:.3g} over the {self.window} steps before and above "
                f"{self.bound:g}: the policy keeps moving away from where it started. Try: read the rollouts "
                f"(-rsd DIR) for a reward exploit; a larger KL coefficient ({self.coef_flag}, now {self.coef:g}); "
                f"a lower learning rate (-lr, now {self.learning_rate:g})")
        return HealthWarning(self.name, first, step, text, {"kl": now, "before": before, "bound": self.bound},
                             self.metric)


@dataclass
class GradSpike(Windowed):
    """One step's gradient norm is ``factor`` times the median of the (up to) ``4 * window`` steps before it, once
    at least ``window`` steps are known."""
    factor: float
    window: int
    learning_rate: float
    max_grad_norm: float
    look: str = "read that step's rollouts (-rsd DIR) for an odd batch"  # where the odd batch can be seen
    name = "grad_spike"
    metric = "grad_norm"
    windows = 4  # the steps before a step, whose median it is measured against

    def check(self, step: int, value: float) -> HealthWarning | None:
        before = self._recent
        median = statistics.median(before.values) if len(before.values) >= self.window else 0.0
        count = len(before.values)
        # a spike joins the history: the median barely moves, and a lasting rise becomes the new norm
        before.add(step, value)
        if not before.starts(median > 0 and value > self.factor * median):
            return None
        clip = (f"clipped to {self.max_grad_norm:g} for the update" if self.max_grad_norm > 0
                else "unclipped: --max-grad-norm is 0")
        text = (f"warning: step {step}: gradient-norm spike: {value:.3g}, {value / median:.1f}x the median "
                f"{median:.3g} of the {count} steps before (the bound: {self.factor:g}x; {clip}): one batch pulled the weights "
                f"hard. Try: {self.look}; a lower learning rate (-lr, now "
                f"{self.learning_rate:g})" + ("" if self.max_grad_norm > 0 else "; --max-grad-norm 1"))
        return HealthWarning(self.name, step, step, text,
                             {"grad_norm": value, "median": median, "bound": self.factor}, self.metric)


@dataclass
class RewardDominance(Windowed):
    """Of a run with several weighted rewards, one makes at least ``share`` of the summed |weight x mean score|
    over ``window`` steps (``reward_parts`` in the rows: each reward's mean own score): the others barely steer
    the policy. ``weights``: --reward-weights as given (1 for a reward not named); ``weights_text``: as typed."""
    share: float
    window: int
    weights: dict
    weights_text: str
    name = "reward_dominance"
    metric = "reward"

    def feed(self, step: int, metrics: dict) -> HealthWarning | None:
        parts, recent = metrics.get("reward_parts"), self._recent
        if metrics.get("kind") == "eval" or not isinstance(parts, dict):
            return None
        weighted = {name: abs(self.weights.get(name, 1.0) * score) for name, score in parts.items()
                    if self.weights.get(name, 1.0) != 0}
        if len(weighted) < 2:  # one weighted reward is the whole sum by design
            return None
        recent.add(step, weighted)
        if not recent.full:
            return None
        means = {name: recent.mean([row.get(name, 0.0) for row in recent.values]) for name in weighted}
        total = sum(means.values())
        top = max(means, key=means.get)
        top_share = means[top] / total if total > 0 else 0.0
        if not recent.starts(top_share >= self.share):
            return None
        shown = ", ".join(f"{name} {value:.3g}" for name, value in sorted(means.items(), key=lambda kv: -kv[1]))
        text = (f"warning: steps {recent.steps[0]}-{step}: one reward dominates: {top} makes {top_share:.0%} of the "
                f"weighted reward (mean |weight x score| over {self.window} steps: {shown}; the bound: "
                f"{self.share:.0%}): the other rewards barely steer the policy. Try: rebalance --reward-weights "
                f"(now {self.weights_text or 'every weight 1'}); read the rollouts (-rsd DIR, reward_parts) for "
                f"{top} earned without doing the task")
        return HealthWarning(self.name, recent.steps[0], step, text,
                             {"dominant": top, "share": top_share, "parts": means, "bound": self.share}, self.metric)


def noise(count_a: int | None, count_b: int | None) -> float:
    """Twice the largest standard error of the difference of two accuracies over ``count_a`` and ``count_b``
    prompts (a share's variance is at most 1/4): a smaller fall may be chance. 0 where a count is not known."""
    if not count_a or not count_b:
        return 0.0
    return 2 * (0.25 / count_a + 0.25 / count_b) ** 0.5


@dataclass
class EvalFalls:
    """A held-out accuracy (the mean reward where no reward defines correctness) fell at least ``drop`` below its
    best evaluation so far, and beyond the two evaluations' sampling noise (``noise``), while the training reward
    (the mean of up to ``window`` steps up to each evaluation's step) rose at least ``rise`` since that best: the
    policy learns what the held-out set does not reward."""
    drop: float
    rise: float
    window: int
    learning_rate: float
    name: str = "eval_falls"

    def __post_init__(self):
        self._rewards: list[tuple[int, float]] = []  # (step, training reward), in the order fed
        self._best: dict[str, tuple[float, int, int | None]] = {}  # "task/mode" -> (best value, its step, count)
        self._holding: dict[str, bool] = {}

    def _reward_at(self, step: int) -> float | None:
        upto = [reward for at, reward in self._rewards if at <= step][-self.window:]
        upto = upto or [reward for _, reward in self._rewards[:self.window]]  # step 0: the first steps' reward
        return sum(upto) / len(upto) if upto else None

    def feed(self, step: int, metrics: dict) -> HealthWarning | None:
        if metrics.get("kind") != "eval":
            reward = _number(metrics, "reward")
            if reward is not None:
                self._rewards.append((step, reward))
            return None
        metric = "accuracy" if isinstance(metrics.get("accuracy"), (int, float)) else "mean_reward"
        value, key = metrics.get(metric), f"{metrics.get('task')}/{metrics.get('mode')}"
        if not isinstance(value, (int, float)):
            return None
        best, count = self._best.get(key), metrics.get("count")
        if best is None or value >= best[0]:
            self._best[key], self._holding[key] = (value, step, count), False
            return None
        then, now = self._reward_at(best[1]), self._reward_at(step)
        bound = max(self.drop, noise(best[2], count))
        holds = best[0] - value >= bound and then is not None and now is not None and now - then >= self.rise
        started, self._holding[key] = holds and not self._holding.get(key), holds
        if not started:
            return None
        text = (f"warning: steps {best[1]}-{step}: held-out {key} {metric.replace('_', ' ')} fell {best[0]:.3f} -> "
                f"{value:.3f} while the training reward rose {then:.3f} -> {now:.3f} (the bounds: a fall of "
                f"{bound:.3g}, a rise of {self.rise:g}): the policy learns what the held-out set does not reward "
                "(over-fitting the training prompts, or a reward exploit). Try: read the rollouts (-rsd DIR) for "
                f"answers that earn reward without being right; the checkpoint nearest step {best[1]} (step_N); a "
                f"lower learning rate (-lr, now {self.learning_rate:g})")
        return HealthWarning(self.name, best[1], step, text,
                             {"eval": key, "best": best[0], "value": value, "reward_then": then, "reward_now": now,
                              "bound": bound},
                             f"eval/{metric}")


def run_monitors(config) -> RunHealth:
    """The monitors of an RL run, as its config asks: --health's thresholds (0 turns one off, ``off`` all of them)
    and ``--equal-reward-steps`` (0 turns that one off)."""
    settings = config.run.health_settings
    if settings is None:
        return RunHealth([])
    d, s, algo = config.data, settings, config.algo
    weights = parse_weights(d.reward_weights)
    monitors: list[Monitor] = []
    if config.run.equal_reward_steps > 0:
        monitors.append(EqualRewards(
            steps=config.run.equal_reward_steps, reward_type=d.reward_type,
            builtin_weighted=d.builtin_reward_counts,
            user_rewards=bool(d.reward_fn or d.reward_url), group_size=config.batch.num_generations,
            temperature=config.sampling.temperature, user_reward_names=d.added_reward_names))
    lr, mnt = algo.learning_rate, config.sampling.max_new_tokens
    kl_flag, kl_coef = (("--kl-coef", algo.ppo.kl_reward_coef) if algo.uses_critic
                        else ("-kl", algo.loss.kl_loss_coef))
    built = (
        (s.entropy_min, lambda: EntropyCollapse(s.entropy_min, s.window, config.sampling.temperature,
                                                algo.loss.clip_eps_high, lr)),
        (s.length_ratio, lambda: LengthDrift(s.length_ratio, s.window, mnt)),
        (s.truncation, lambda: Truncation(s.truncation, s.window, mnt)),
        (s.kl_max, lambda: KLRising(s.kl_max, s.window, kl_flag, kl_coef, lr)),
        (s.grad_spike, lambda: GradSpike(s.grad_spike, s.window, lr, algo.max_grad_norm)),
        (s.dominance, lambda: RewardDominance(s.dominance, s.window, weights, d.reward_weights or "")),
        (s.eval_drop, lambda: EvalFalls(s.eval_drop, s.reward_rise, s.window, lr)),
    )
    monitors += [build() for threshold, build in built if threshold > 0]
    return RunHealth(monitors, s.quiet_steps)


def stage_monitors(settings, learning_rate: float, max_grad_norm: float) -> RunHealth:
    """The monitors of an SFT/RM stage (``--health`` as parsed; None: off): the gradient spike; the others read
    what a stage has not (rollouts, rewards, a reference's KL, accuracy beside a training reward)."""
    if settings is None or settings.grad_spike <= 0:
        return RunHealth([])
    return RunHealth([GradSpike(settings.grad_spike, settings.window, learning_rate, max_grad_norm,
                                look="read that step's rows for an odd one (a step's batch depends only on the step "
                                     "and --seed)")], settings.quiet_steps)
