"""Run-health monitors on synthetic metric streams: the equal-rewards warning fires once after N steps in a
row, stays quiet otherwise, is rate-limited; the rollout metrics it reads, computed from groups by hand."""

import pytest

from coati.launcher.health import EqualRewards, RunHealth
from coati.rollout.group import RolloutGroup
from coati.trainer.step_data import equal_reward_metrics, rollout_metrics


def monitor(steps=3, **kwargs):
    options = dict(reward_type="boxed", builtin_weighted=True, user_rewards=False, group_size=8, temperature=1.0)
    return EqualRewards(steps=steps, **{**options, **kwargs})


def flat(reasons=None, groups=4, values=(0.0,)):
    return {"reward_groups": groups, "equal_reward_groups": groups, "equal_reward_values": list(values),
            "reasons": reasons or {"no \\boxed{} answer": 32}}


def learning(groups=4):
    return {"reward_groups": groups, "equal_reward_groups": groups - 1, "equal_reward_values": [0.0],
            "reasons": {"ok": 3, "wrong answer": 29}}


def feed(health, rows, start=1):
    return [(step, w) for step, row in enumerate(rows, start) for w in health.feed(step, row)]


def test_fires_once_after_n_flat_steps_with_reasons_and_suggestions():
    warnings = feed(RunHealth([monitor()]), [flat()] * 10)
    assert [step for step, _ in warnings] == [3]
    text = warnings[0][1].text
    assert text.startswith("warning: steps 1-3: every group's rewards are equal (all 0): nothing to learn. "
                           "Reasons: no \\boxed{} answer 100%. Try: ")
    assert "system prompt (-s)" in text and "--reward-fn file.py:fn --reward-weights boxed:0" in text
    assert "-g, now 8" in text and "-temp, now 1" in text and "\n" not in text
    row = warnings[0][1].row()
    assert row["monitor"] == "equal_rewards" and (row["first_step"], row["last_step"]) == (1, 3)
    assert row["reasons"] == {"no \\boxed{} answer": 96} and row["values"] == [0.0]


def test_quiet_while_any_group_differs_and_the_streak_restarts():
    health = RunHealth([monitor()], quiet_steps=0)
    assert feed(health, [flat(), flat(), learning(), flat(), flat(), learning()]) == []
    warnings = feed(health, [flat(), flat(), flat()], start=7)
    assert [(w.first_step, w.last_step) for _, w in warnings] == [(7, 9)]


def test_mixed_reasons_are_counted_over_the_streak():
    rows = [flat({"no \\boxed{} answer": 24, "wrong answer": 8}), flat({"wrong answer": 32}),
            flat({"wrong answer": 16, "no \\boxed{} answer": 16})]
    [(_, warning)] = feed(RunHealth([monitor()]), rows)
    assert "Reasons: wrong answer 58%, no \\boxed{} answer 42%." in warning.text


def test_steps_without_groups_of_several_samples_neither_count_nor_break():
    empty = {"reward_groups": 0, "equal_reward_groups": 0}
    warnings = feed(RunHealth([monitor()]), [flat(), empty, flat(), empty, flat()])
    assert [step for step, _ in warnings] == [5]


def test_rate_limited_between_streaks():
    health = RunHealth([monitor(steps=2)], quiet_steps=10)
    rows = [flat(), flat(), learning(), flat(), flat(), learning()] + [learning()] * 6 + [flat(), flat()]
    assert [step for step, _ in feed(health, rows)] == [2, 14]  # the streak at 4-5 falls in the quiet steps


def test_all_right_suggests_harder_prompts_and_user_reward_hints_are_left_out():
    mine = monitor(user_rewards=True)
    [(_, warning)] = feed(RunHealth([mine]), [flat({"ok": 32}, values=(1.0,))] * 3)
    assert "(all 1)" in warning.text and "harder prompts" in warning.text and "--reward-fn" not in warning.text
    # the same with the built-in weighted 0: the records say the weighted rewards' "correct"
    theirs = monitor(user_rewards=True, builtin_weighted=False, user_reward_names=("first_number",))
    [(_, warning)] = feed(RunHealth([theirs]), [flat({"correct": 32}, values=(1.0,))] * 3)
    assert "harder prompts" in warning.text and "Verdicts of the weighted rewards: correct 100%." in warning.text


def test_a_user_reward_that_never_differs_is_named_and_its_verdicts_are_labelled():
    mine = monitor(user_rewards=True, builtin_weighted=False)
    [(_, warning)] = feed(RunHealth([mine]), [flat({"incorrect": 20, "correct": 12})] * 3)
    assert "Verdicts of the weighted rewards: incorrect 62%, correct 38%." in warning.text
    assert "that scores the samples of a prompt apart" in warning.text and "system prompt" not in warning.text


def group(rewards, reasons=()):
    n = len(rewards)
    return RolloutGroup(prompt_ids=[1], responses=[[2]] * n, logprobs=[[0.0]] * n, rewards=list(rewards),
                        correct=[r == 1.0 for r in rewards], format_ok=[True] * n, finish_reasons=["stop"] * n,
                        policy_version=0, reasons=list(reasons))


def test_equal_reward_metrics_by_hand():
    groups = [group([0.0, 0.0], ["no \\boxed{} answer"] * 2), group([0.1, 1.0], ["wrong answer", "ok"]),
              group([0.1, 0.1], ["wrong answer"] * 2), group([1.0])]
    assert equal_reward_metrics(groups) == {
        "reward_groups": 3, "equal_reward_groups": 2, "equal_reward_values": [0.0, 0.1],
        "reasons": {"wrong answer": 3, "no \\boxed{} answer": 2, "ok": 1}}


def test_rollout_accuracy_is_absent_when_not_defined():
    undefined = group([0.5, 0.2])
    undefined.correct = [None, None]
    assert "accuracy" not in rollout_metrics([undefined], 0)
    assert rollout_metrics([group([1.0, 0.1])], 0)["accuracy"] == 0.5


def test_reward_part_metrics_by_hand():
    from coati.trainer.step_data import reward_part_metrics

    parted = group([1.0, 0.3])
    parted.reward_parts = [{"boxed": 1.0, "length_penalty": -0.2, "length_penalty/chars": 164.0, "fn/correct": True},
                           {"boxed": 0.1, "length_penalty": -0.6}]
    other = group([0.5])
    other.reward_parts = [{"boxed": 0.4, "length_penalty": 0.2}]
    metrics = reward_part_metrics([parted, other])
    assert metrics.keys() == {"reward_parts"}
    assert metrics["reward_parts"] == pytest.approx({"boxed": 0.5, "length_penalty": -0.2})  # (1 + .1 + .4) / 3
    assert reward_part_metrics([group([1.0, 0.0])]) == {}  # the built-in reward alone: no parts
    assert "reward_parts" in rollout_metrics([parted], 0)


def test_with_the_built_in_reward_weighted_0_the_warning_names_the_users_reward_and_no_given_flag():
    """--reward-fn first_number.py:first_number --reward-weights boxed:0 (issue 53's Gemma run): the flat reward is
    the user's, and the advice is to change it, not to pass --reward-fn again."""
    mine = monitor(user_rewards=True, builtin_weighted=False, user_reward_names=("first_number",))
    [(_, warning)] = feed(RunHealth([mine]), [flat({"incorrect": 32})] * 3)
    assert ("nothing to learn. your reward first_number gave every sample of a prompt the same score. Verdicts of "
            "the weighted rewards: incorrect 100%.") in warning.text
    assert ("Try: a version of your reward first_number that scores the samples of a prompt apart (the rollout logs, "
            "-rsd DIR, show each part's score per sample); more samples per prompt (-g, now 8)") in warning.text
    assert "--reward-fn" not in warning.text and "system prompt" not in warning.text
    two = monitor(user_rewards=True, builtin_weighted=False, user_reward_names=("a", "remote"))
    [(_, warning)] = feed(RunHealth([two]), [flat()] * 3)
    assert "your rewards a, the reward server (--reward-url) gave every sample" in warning.text


def test_the_monitor_of_a_run_gets_the_names_of_its_rewards(tmp_path):
    from coati.config.cli import build_parser, config_from_args
    from coati.launcher.health import run_monitors

    argv = ["-m", str(tmp_path), "-d", str(tmp_path / "d.jsonl"), "--reward-fn", "my/first_number.py:first_number",
            "--reward-url", "http://127.0.0.1:9/score", "--reward-weights", "boxed:0"]
    config = config_from_args(build_parser().parse_args(argv))
    [equal] = [m for m in run_monitors(config).monitors if isinstance(m, EqualRewards)]
    assert equal.user_reward_names == ("first_number", "remote") and not equal.builtin_weighted
