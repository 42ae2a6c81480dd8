"""The driver's wait bounds (cluster/deadlines.py) against hand-computed values."""

from __future__ import annotations

from coati.cluster.deadlines import Deadlines
from rewards.remote import give_up_s


def test_a_first_wait_of_a_kind_gets_the_start_up_bound_scaled():
    assert Deadlines(scale=1.0).bound("step") == 1800.0
    assert Deadlines(scale=0.5).bound("save") == 900.0


def test_a_later_wait_gets_a_multiple_of_the_slowest_of_its_kind_with_a_floor():
    deadlines = Deadlines(scale=1.0)
    deadlines.record("step", 12.0)
    deadlines.record("step", 45.0)
    deadlines.record("step", 20.0)  # not the slowest: the bound stays 10 x 45
    assert deadlines.bound("step") == 450.0
    deadlines.record("save", 2.0)  # 10 x 2 = 20 s is under the 300 s floor
    assert deadlines.bound("save") == 300.0
    assert deadlines.bound("evaluation") == 1800.0  # a kind never completed: still the start-up bound


def test_the_scale_multiplies_every_bound_and_zero_means_no_bound():
    deadlines = Deadlines(scale=0.02)
    deadlines.record("step", 50.0)
    assert deadlines.bound("step") == 0.02 * 500.0 and deadlines.bound("save") == 0.02 * 1800.0
    unbounded = Deadlines(scale=0)
    unbounded.record("step", 1.0)
    assert unbounded.bound("step") is None and unbounded.bound("save") is None


def test_no_bound_falls_below_an_inner_waits_own_give_up_time():
    # a reward server with a 1 s timeout and 1 retry gives up after 1 + 0.5 + 1 = 2.5 s
    assert give_up_s(1.0, 1) == 2.5
    assert give_up_s(30.0, 3) == 4 * 30.0 + 0.5 + 1.0 + 2.0
    deadlines = Deadlines(scale=0.01, least_s=2 * give_up_s(1.0, 1))
    assert deadlines.bound("step") == 18.0  # 1800 x 0.01 is above 5 s
    deadlines.record("step", 1.0)
    assert deadlines.bound("step") == 5.0  # max(300, 10) x 0.01 = 3 s would be under it


def test_wait_scale_flag_default_and_its_one_line_refusal(demo_assets):
    import pytest

    from coati.config.cli import build_parser, config_from_args
    from coati.config.errors import ConfigError

    def config(*argv):
        return config_from_args(build_parser().parse_args(list(argv)), demo_assets)

    assert config().run.wait_scale == 1.0 and config("--wait-scale", "0").run.wait_scale == 0.0
    with pytest.raises(ConfigError, match=r"^--wait-scale must be a number >= 0 \(0: wait forever, 1: the default "
                                          r"bounds\), got -1$"):
        config("--wait-scale", "-1")
