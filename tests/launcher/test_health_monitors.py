"""The run-health monitors beside the equal-rewards one: each fires once on a hand-made metrics stream built to trip
it, with the numbers of that stream in its line, and stays quiet on a healthy one; --health configures them; and
real metrics rows of the two demos pass through every monitor at its defaults without a warning.

The demos' rows (tests/launcher/fixtures/, the keys the monitors read): addition_demo.jsonl is the addition demo's
64 steps with its evaluations at 0 and 64 (`rl_example.py`, no flags, 2026-11-27); smollm2_demo.jsonl is the
real-model demo's first run (`--demo smollm2`, steps 1-7 and the evaluation at 0, the numbers of docs/results.md's
"The real-model demo's first runs")."""

import json
import os

import pytest

from coati.config.cli import build_parser, config_from_args
from coati.config.errors import ConfigError
from coati.config.health import HealthSettings, parse_health
from coati.launcher.health import (
    EntropyCollapse,
    EvalFalls,
    GradSpike,
    KLRising,
    LengthDrift,
    RewardDominance,
    RunHealth,
    Truncation,
    noise,
    run_monitors,
)
from coati.train import placeholder_demo

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")


def feed(monitor, key, values, start=1, extra=None):
    """(step, warning) of each warning ``monitor`` gives on rows holding ``values`` under ``key``."""
    fired = []
    for step, value in enumerate(values, start):
        warning = monitor.feed(step, {key: value, **(extra or {})})
        if warning is not None:
            fired.append((step, warning))
    return fired


def one(fired):
    assert len(fired) == 1, [w.text for _, w in fired]
    return fired[0]


# --- entropy collapse ---

def entropy(**kwargs):
    return EntropyCollapse(**{"minimum": 0.05, "window": 3, "temperature": 1.0, "clip_eps_high": 0.2,
                              "learning_rate": 3e-4, **kwargs})


def test_entropy_collapse_fires_once_when_the_window_mean_falls_below_the_bound():
    # window means: 0.3 (the start), 0.2, 0.117, 0.06, then steps 5-7: (0.05 + 0.03 + 0.02) / 3 = 0.0333
    step, warning = one(feed(entropy(), "entropy", [0.4, 0.3, 0.2, 0.1, 0.05, 0.03, 0.02, 0.01, 0.01]))
    assert step == 7 and (warning.first_step, warning.last_step) == (5, 7)
    assert warning.text.startswith("warning: steps 5-7: entropy collapse: the policy's entropy is 0.0333 nats per "
                                   "token (mean of 3 steps; 0.3 over the run's first 3), below 0.05")
    assert "-temp, now 1" in warning.text and "clip_eps_high" in warning.text and "-lr, now 0.0003" in warning.text
    assert warning.row()["metric"] == "entropy" and warning.row()["entropy"] == pytest.approx(0.1 / 3)


def test_entropy_quiet_while_healthy_and_clip_higher_not_suggested_when_set():
    # the real-model demo's entropies: a steep fall that stays far above the bound
    assert feed(entropy(), "entropy", [2.384, 1.626, 1.242, 0.946, 0.456, 0.385, 0.312]) == []
    _, warning = one(feed(entropy(clip_eps_high=0.28), "entropy", [0.01] * 4))
    assert "clip_eps_high" not in warning.text
    # rows without the metric (a skipped step, an eval row) neither count nor break the window
    monitor = entropy()
    assert monitor.feed(1, {"entropy": 0.01}) is None and monitor.feed(2, {"skipped": "x"}) is None
    assert monitor.feed(3, {"kind": "eval", "entropy": 0.01}) is None and monitor.feed(4, {"entropy": 0.01}) is None
    assert monitor.feed(5, {"entropy": 0.01}) is not None


def test_entropy_fires_again_only_after_recovering():
    values = [0.01] * 4 + [0.5] * 3 + [0.01] * 3
    assert [step for step, _ in feed(entropy(), "entropy", values)] == [3, 10]


# --- response length drift ---

def test_length_drift_longer_against_the_first_window():
    # baseline steps 1-2: 100; windows after it: 135, 175, 255, then steps 6-7: 320 = 3.2x
    step, warning = one(feed(LengthDrift(3.0, 2, 512), "response_length", [100, 100, 120, 150, 200, 310, 330, 400]))
    assert step == 7
    assert warning.text.startswith("warning: steps 6-7: response length drift: 320.0 tokens on average, 3.20x the "
                                   "100.0 of steps 1-2 (the bound: 3x either way)")
    assert "repetition" in warning.text and "-mnt, now 512" in warning.text
    assert warning.row()["ratio"] == pytest.approx(3.2)


def test_length_drift_shorter_and_quiet_within_the_ratio():
    # 10.5 / 30 = 0.35 is inside 1/3; then 9.5 / 30 = 0.317 is not
    step, warning = one(feed(LengthDrift(3.0, 2, 512), "response_length", [30, 30, 12, 9, 10]))
    assert step == 5 and "9.5 tokens on average, 0.32x the 30.0" in warning.text
    assert "skip the work" in warning.text
    # the real-model demo's lengths: 23 -> 11 tokens is 0.6x
    assert feed(LengthDrift(3.0, 5, 512), "response_length", [23.0, 19.6, 20.2, 13.9, 11.0, 11.3, 10.6] * 2) == []


# --- truncation ---

def test_truncation_fires_when_the_window_mean_reaches_the_rate():
    # window means: 0.367, 0.367, then steps 3-5: 0.433
    step, warning = one(feed(Truncation(0.4, 3, 8), "truncation_rate", [0.5, 0.4, 0.2, 0.5, 0.6, 0.5]))
    assert step == 5
    assert warning.text.startswith("warning: steps 3-5: 43% of the responses hit the -mnt limit of 8 tokens (mean "
                                   "of 3 steps; the bound: 40%)")
    assert "a larger -mnt (now 8)" in warning.text and "filter_truncated_response" in warning.text
    assert warning.row()["rate"] == pytest.approx(1.3 / 3)


def test_truncation_quiet_on_the_real_model_demos_falling_rate():
    assert feed(Truncation(0.4, 5, 128), "truncation_rate", [0.438, 0.359, 0.328, 0.078, 0.016, 0.062, 0.047]) == []


# --- KL to the reference rising ---

def kl(**kwargs):
    return KLRising(**{"bound": 0.1, "window": 2, "coef_flag": "-kl", "coef": 0.04, "learning_rate": 1e-6,
                       **kwargs})


def test_kl_rising_above_the_bound():
    # step 4: (0.08 + 0.12) / 2 = 0.1 is not above 0.1; step 5: 0.135, up from (0.05 + 0.08) / 2 = 0.065
    step, warning = one(feed(kl(), "kl", [0.02, 0.05, 0.08, 0.12, 0.15, 0.2, 0.3]))
    assert step == 5
    assert warning.text.startswith("warning: steps 4-5: KL to the reference rising: 0.135 per token (mean of 2 "
                                   "steps), up from 0.065 over the 2 steps before and above 0.1")
    assert "(-kl, now 0.04)" in warning.text and "-lr, now 1e-06" in warning.text


def test_kl_held_steady_above_the_bound_or_rising_below_it_is_quiet():
    assert feed(kl(), "kl", [0.2] * 10) == []  # a controller holding it at its target
    assert feed(kl(), "kl", [0.01 * k for k in range(10)]) == []  # rising, but not past 0.1
    assert feed(kl(), "entropy", [1.0] * 10) == []  # no reference model: no kl in the rows


# --- gradient-norm spikes ---

def spike(**kwargs):
    return GradSpike(**{"factor": 5.0, "window": 3, "learning_rate": 3e-4, "max_grad_norm": 1.0, **kwargs})


def test_grad_spike_against_the_median_before():
    # step 5: median(1.0, 1.2, 0.8, 1.1) = 1.05, and 6.0 > 5 x 1.05; step 7 again after a normal step
    norms = [1.0, 1.2, 0.8, 1.1, 6.0, 1.0, 7.0]
    fired = feed(spike(), "grad_norm", norms)
    assert [step for step, _ in fired] == [5, 7]
    warning = fired[0][1]
    assert warning.text.startswith("warning: step 5: gradient-norm spike: 6, 5.7x the median 1.05 of the 4 steps "
                                   "before (the bound: 5x; clipped to 1 for the update)")
    # RunHealth lets the same monitor warn once per quiet_steps
    health = RunHealth([spike()], quiet_steps=100)
    assert [s for s, row in enumerate(norms, 1) for _ in health.feed(s, {"grad_norm": row})] == [5]


def test_grad_spike_quiet_before_a_window_and_on_steady_norms():
    assert feed(spike(), "grad_norm", [12.5, 1.8, 1.7]) == []  # a large first step has nothing to compare with
    assert feed(spike(), "grad_norm", [1.0, 2.0, 1.5, 3.0, 2.5, 4.0, 0.9, 1.4]) == []
    assert feed(spike(), "grad_norm", [0.0, 0.0, 0.0, 0.5]) == []  # equal rewards: no gradient yet, no median
    _, warning = one(feed(spike(max_grad_norm=0.0), "grad_norm", [1.0, 1.0, 1.0, 9.0]))
    assert "unclipped: --max-grad-norm is 0" in warning.text and "--max-grad-norm 1" in warning.text


def test_a_stage_has_the_grad_spike_monitor_alone_with_its_own_hint():
    from coati.config.health import HealthSettings, parse_health
    from coati.launcher.health import stage_monitors

    health = stage_monitors(parse_health("window=3"), 2e-5, 1.0)
    assert [type(monitor) for monitor in health.monitors] == [GradSpike] and health.quiet_steps == 100
    fired = [(step, w) for step, norm in enumerate([1.0, 1.2, 0.8, 1.1, 6.0], 1)
             for w in health.feed(step, {"loss": 1.0, "grad_norm": norm})]
    assert [step for step, _ in fired] == [5]
    assert "Try: read that step's rows for an odd one (a step's batch depends only on the step and --seed); a " \
           "lower learning rate (-lr, now 2e-05)" in fired[0][1].text and "-rsd" not in fired[0][1].text
    assert stage_monitors(None, 2e-5, 1.0).monitors == []  # --health off
    assert stage_monitors(HealthSettings(grad_spike=0), 2e-5, 1.0).monitors == []


# --- one reward dominating ---

def test_one_reward_dominating_the_weighted_sum():
    monitor = RewardDominance(0.9, 2, {"length_penalty": 0.1}, "length_penalty:0.1")
    # |1 x 0.95| and |0.1 x -0.5|: boxed makes 0.95 / 1.0 of it
    step, warning = one(feed(monitor, "reward_parts", [{"boxed": 0.95, "length_penalty": -0.5}] * 3))
    assert step == 2
    assert warning.text.startswith("warning: steps 1-2: one reward dominates: boxed makes 95% of the weighted reward "
                                   "(mean |weight x score| over 2 steps: boxed 0.95, length_penalty 0.05; the "
                                   "bound: 90%)")
    assert "--reward-weights (now length_penalty:0.1)" in warning.text
    assert warning.row()["dominant"] == "boxed" and warning.row()["share"] == pytest.approx(0.95)


def test_balanced_or_single_weighted_rewards_are_quiet():
    balanced = RewardDominance(0.9, 2, {"length_penalty": 0.1}, "")
    assert feed(balanced, "reward_parts", [{"boxed": 0.5, "length_penalty": -2.0}] * 4) == []  # 0.5 vs 0.2: 71%
    # the real-model demo: the built-in reward weighted 0, the demo's own the whole sum by design
    single = RewardDominance(0.9, 2, {"boxed": 0.0, "last_integer": 1.0}, "boxed:0,last_integer:1")
    assert feed(single, "reward_parts", [{"boxed": 1.0, "last_integer": 0.1}] * 4) == []


# --- eval falling while the training reward rises ---

def eval_row(task, mode, **numbers):
    return {"kind": "eval", "task": task, "mode": mode, **numbers}


def test_eval_falls_while_training_reward_rises():
    monitor = EvalFalls(drop=0.1, rise=0.05, window=2, learning_rate=3e-4)
    rows = [(0, eval_row("add", "greedy", accuracy=0.5))]
    rows += [(step, {"reward": reward}) for step, reward in zip(range(1, 3), (0.2, 0.3))]
    rows += [(2, eval_row("add", "greedy", accuracy=0.55))]  # the best: training reward (0.2 + 0.3) / 2 = 0.25
    rows += [(step, {"reward": reward}) for step, reward in zip(range(3, 7), (0.4, 0.5, 0.6, 0.7))]
    rows += [(6, eval_row("add", "greedy", accuracy=0.4))]  # 0.15 below it; reward (0.6 + 0.7) / 2 = 0.65
    fired = [(step, w) for step, row in rows if (w := monitor.feed(step, row)) is not None]
    step, warning = one(fired)
    assert step == 6 and (warning.first_step, warning.last_step) == (2, 6)
    assert warning.text.startswith("warning: steps 2-6: held-out add/greedy accuracy fell 0.550 -> 0.400 while the "
                                   "training reward rose 0.250 -> 0.650 (the bounds: a fall of 0.1, a rise of 0.05)")
    assert warning.row()["metric"] == "eval/accuracy"


def test_eval_falls_quiet_when_the_reward_falls_too_and_mean_reward_without_accuracy():
    monitor = EvalFalls(drop=0.1, rise=0.05, window=2, learning_rate=3e-4)
    for step in range(1, 5):
        monitor.feed(step, {"reward": 0.5})
    assert monitor.feed(0, eval_row("add", "sampled", mean_reward=0.6)) is None  # step 0: the first steps' reward
    assert monitor.feed(4, eval_row("add", "sampled", mean_reward=0.3)) is None  # training reward flat: 0.5, 0.5
    for step in range(5, 9):
        monitor.feed(step, {"reward": 0.9})
    warning = monitor.feed(8, eval_row("add", "sampled", mean_reward=0.3))
    assert warning is not None and "add/sampled mean reward fell 0.600 -> 0.300" in warning.text
    assert "rose 0.500 -> 0.900" in warning.text and warning.metric == "eval/mean_reward"
    # another task's evaluations are compared with their own best
    assert monitor.feed(8, eval_row("other", "sampled", mean_reward=0.1)) is None


# --- --health ---

def config_for(*argv):
    return config_from_args(build_parser().parse_args(list(argv)), placeholder_demo())


def names(health):
    return [monitor.name for monitor in health.monitors]


def test_run_monitors_follow_health_and_equal_reward_steps():
    assert names(run_monitors(config_for())) == [
        "equal_rewards", "entropy_collapse", "length_drift", "truncation", "kl_rising", "grad_spike",
        "reward_dominance", "eval_falls"]
    assert run_monitors(config_for("--health", "off")).monitors == []
    health = run_monitors(config_for("--health", "entropy_min=0, truncation=0.25,quiet_steps=7",
                                     "--equal-reward-steps", "0"))
    assert "entropy_collapse" not in names(health) and "equal_rewards" not in names(health)
    assert health.quiet_steps == 7
    [truncation] = [m for m in health.monitors if m.name == "truncation"]
    assert truncation.rate == 0.25 and truncation.max_new_tokens == 8  # the addition demo's -mnt


def test_parse_health_defaults_and_values():
    assert parse_health(None) == parse_health("") == HealthSettings()
    assert parse_health("off") is None
    assert parse_health("window=10,grad_spike=0") == HealthSettings(window=10, grad_spike=0.0)


@pytest.mark.parametrize("text, message", [
    ("entropy=0.1", "--health: unknown key 'entropy' (did you mean 'entropy_min'?)"),
    ("window=0", "--health window must be at least 1, got 0"),
    ("window=2.5", "--health window: needs a number >= 0 (int), as window=VALUE; got 'window=2.5'"),
    ("kl_max", "--health kl_max: needs a number >= 0 (float)"),
    ("grad_spike=-1", "--health grad_spike: needs a number >= 0"),
    ("truncation=1.5", "--health truncation is a share of the responses, 0-1, got 1.5"),
    ("length_ratio=0.5", "--health length_ratio must be 0 (off) or > 1, got 0.5"),
])
def test_bad_health_is_one_line_at_start(text, message):
    with pytest.raises(ConfigError) as err:
        config_for("--health", text)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


# --- quiet on the demos ---

def replay(name, config):
    """Every row of a demo's metrics, fed as the driver feeds them (eval rows marked, train rows without kind)."""
    health, fired = run_monitors(config), []
    with open(os.path.join(FIXTURES, name), encoding="utf-8") as handle:
        for line in handle:
            row = json.loads(line)
            if row.pop("kind") == "eval":
                row["kind"] = "eval"
            fired += health.feed(row["step"], row)
    return [warning.text for warning in fired]


@pytest.mark.parametrize("name, tight", [
    ("addition_demo.jsonl", "entropy_min=0.35"),  # its entropy ends near 0.3
    ("smollm2_demo.jsonl", "truncation=0.2"),  # its first five steps cut 24% of the responses
])
def test_quiet_on_the_demos_real_metrics(name, tight):
    assert replay(name, config_for()) == []
    # the replay does reach the monitors: a tighter bound fires on the same rows
    assert len(replay(name, config_for("--health", tight))) == 1


def test_eval_falls_beyond_the_evaluations_noise_only():
    """With counts: a fall must also pass 2 x sqrt(1/4n + 1/4m), 0.25 for two evaluations of 32 prompts."""
    monitor = EvalFalls(drop=0.1, rise=0.05, window=2, learning_rate=3e-4)
    monitor.feed(1, {"reward": 0.3})
    assert monitor.feed(1, eval_row("add", "greedy", accuracy=0.688, count=32)) is None
    monitor.feed(2, {"reward": 0.5})
    assert monitor.feed(2, eval_row("add", "greedy", accuracy=0.5, count=32)) is None  # 0.188: chance at n=32
    warning = monitor.feed(2, eval_row("add", "greedy", accuracy=0.4, count=32))  # 0.288 is not
    assert warning is not None and "(the bounds: a fall of 0.25, a rise of 0.05)" in warning.text
    # 512 prompts each: 2 x sqrt(1/1024) = 0.0625, below the 0.1 that rules then
    assert noise(512, 512) == pytest.approx(0.0625) and noise(None, 32) == 0.0
