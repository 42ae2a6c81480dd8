"""RLOO's leave-one-out baseline, by hand, and chosen by name through --grpo-config."""

import pytest
import torch

import rl_example
from coati.algorithm.advantage import compute_advantages, get_adv_estimator, rloo_advantages
from coati.config.cli import build_parser, config_from_args


def test_rloo_by_hand():
    # group 1: r = [1, 0, 0, 1]: A_0 = 1 - (0 + 0 + 1) / 3 = 2/3, A_1 = 0 - (1 + 0 + 1) / 3 = -2/3
    # group 2: r = [0.5, 0.1, 0.1, 0.1]: A_0 = 0.5 - 0.1 = 0.4, A_1 = 0.1 - (0.5 + 0.1 + 0.1) / 3 = -0.1333...
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.5, 0.1, 0.1, 0.1]])
    expected = torch.tensor([[2 / 3, -2 / 3, -2 / 3, 2 / 3], [0.4, -0.4 / 3, -0.4 / 3, -0.4 / 3]])
    assert torch.allclose(rloo_advantages(rewards), expected, atol=1e-6)
    # G = 2: each sample's baseline is the other's reward
    assert rloo_advantages(torch.tensor([[3.0, 1.0]])).tolist() == [[2.0, -2.0]]
    # equal rewards: no signal
    assert rloo_advantages(torch.full((1, 5), 0.7)).abs().max() < 1e-6


def test_rloo_needs_two_samples():
    with pytest.raises(ValueError, match="rloo needs at least 2 samples per group"):
        rloo_advantages(torch.tensor([[1.0]]))


def test_rloo_is_chosen_by_name():
    assert get_adv_estimator("rloo").inputs == "group"
    rewards = torch.tensor([[1.0, 0.0, 0.0]])
    assert torch.allclose(compute_advantages(rewards, "rloo"), torch.tensor([[1.0, -0.5, -0.5]]))
    args = build_parser().parse_args(["-a", "GRPO", "--grpo-config", '{"advantage": "rloo"}'])
    config = config_from_args(args, rl_example._placeholder_demo())
    assert config.algo.groups.advantage == "rloo" and not config.algo.uses_critic
