"""The console line of an evaluation result, and when it shows the built-in reward's format rate."""

from __future__ import annotations

from coati.config.cli import build_parser, config_from_args
from coati.launcher.eval_schedule import eval_line

OUT = {"accuracy": 0.5, "mean_reward": 0.7, "format_rate": 0.25, "count": 96, "version": 3}


def data_config(*flags: str):
    return config_from_args(build_parser().parse_args(["-m", "m", "-d", "d.jsonl", *flags])).data


def test_the_line_names_step_result_and_weights():
    assert eval_line(3, "add/greedy", OUT, True, True) == (
        "eval step 3 add/greedy: accuracy 0.500 format 0.250 (n=96, weights v3)")
    assert eval_line(4, "add/sampled", OUT, False, True).endswith("(n=96, weights v3 + training to step 4)")


def test_the_format_rate_is_left_out_when_the_built_in_reward_does_not_count():
    assert eval_line(3, "add/greedy", OUT, True, False) == "eval step 3 add/greedy: accuracy 0.500 (n=96, weights v3)"
    undefined = eval_line(0, "t/greedy", {**OUT, "accuracy": None}, True, False)
    assert "mean reward 0.700" in undefined and "format" not in undefined


def test_the_built_in_reward_counts_unless_its_weight_is_zero(tmp_path):
    reward = tmp_path / "mine.py"
    reward.write_text("def mine(response, label, row):\n    return 1.0\n")
    user = ("-rt", "boxed", "--reward-fn", f"{reward}:mine")
    assert data_config().builtin_reward_counts
    assert data_config(*user, "--reward-weights", "boxed:0.5,mine:1").builtin_reward_counts
    assert data_config(*user).builtin_reward_counts  # every weight is 1 unless given
    assert not data_config(*user, "--reward-weights", "boxed:0,mine:1").builtin_reward_counts
