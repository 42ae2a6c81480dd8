"""Advantages (group estimators, GAE), group filters, overlong punishment, sample selection, KL-in-reward and
whitening against hand-computed numbers."""

import math

import pytest
import torch

from coati.algorithm.advantage import (
    adv_estimator_names,
    compute_advantages,
    discounted_returns,
    gae,
    get_adv_estimator,
    group_accuracy_in_range,
    group_advantages,
    group_mean_advantages,
    kl_penalised_rewards,
    last_token_index,
    masked_mean,
    masked_var,
    masked_whiten,
    overlong_penalty,
    register_adv_est,
    sample_loss_mask,
    topk_sample_mask,
)
from coati.config.algo import GroupConfig
from coati.rollout.group import RolloutGroup
from coati.trainer.group_algorithm import shaped_group_tensors


def close(tensor, expected, tol=1e-4):
    return torch.allclose(tensor.float(), torch.tensor(expected, dtype=torch.float32), atol=tol)


def test_group_advantages_by_hand():
    # mean 0.5; unbiased std = sqrt(4 * 0.25 / 3) = 0.57735 -> +-0.5 / 0.57735 = +-0.866025
    adv = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]))
    assert close(adv, [[0.866025, -0.866025, -0.866025, 0.866025]])


def test_all_equal_groups_get_zero_advantage():
    rewards = torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0], [0.1, 0.1, 0.1, 0.1]])
    assert group_advantages(rewards).abs().max() == 0
    assert group_mean_advantages(rewards).abs().max() < 1e-7


def test_group_mean_advantages_for_pg():
    # mean 0.3: r - mean, no scaling by the std
    assert close(group_mean_advantages(torch.tensor([[1.0, 0.1, 0.1, 0.0]])), [[0.7, -0.2, -0.2, -0.3]], 1e-6)
    assert close(compute_advantages(torch.tensor([[2.0, 0.0]]), "group_mean"), [[1.0, -1.0]])
    # group_norm on the same: std = sqrt(2) -> +-1/sqrt(2)
    assert close(compute_advantages(torch.tensor([[2.0, 0.0]]), "group_norm"), [[1 / math.sqrt(2), -1 / math.sqrt(2)]])
    with pytest.raises(ValueError):
        compute_advantages(torch.zeros(1, 2), "no_such_estimator")
    with pytest.raises(ValueError):
        group_mean_advantages(torch.zeros(4))


def test_accuracy_filter_drops_all_correct_and_all_wrong_groups():
    correct = torch.tensor([[1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0]])
    assert group_accuracy_in_range(correct, 0.01, 0.99).tolist() == [False, False, True, True]
    # bounds are inclusive: accuracy 0.25 is kept by [0.25, 0.5], 0.75 is not
    assert group_accuracy_in_range(correct, 0.25, 0.5).tolist() == [False, False, True, False]
    assert group_accuracy_in_range(correct, 0.0, 1.0).all()


def test_overlong_penalty_by_hand():
    # L_max 8, L_cache 2: free up to 6; 7 -> (6 - 7) / 2 = -0.5; 8 -> -1; beyond -> -1
    assert close(overlong_penalty(torch.tensor([1, 5, 6, 7, 8, 9]), 8, 2), [0, 0, 0, -0.5, -1.0, -1.0])
    # L_max 20, L_cache 5: free up to 15; 16 -> -0.2; 18 -> -0.6; 20 -> -1
    assert close(overlong_penalty(torch.tensor([15, 16, 18, 20]), 20, 5), [0, -0.2, -0.6, -1.0])
    # cache == L_max: the penalty starts at the first token
    assert close(overlong_penalty(torch.tensor([0, 2, 4]), 4, 4), [0, -0.5, -1.0])
    for bad in (0, 9):
        with pytest.raises(ValueError, match="cache_length"):
            overlong_penalty(torch.tensor([1]), 8, bad)


def test_topk_keeps_highest_rewards_with_ties_broken_by_index():
    assert topk_sample_mask(torch.tensor([[0.1, 1.0, 1.0, 0.0]]), 2).tolist() == [[False, True, True, False]]
    assert topk_sample_mask(torch.tensor([[1.0, 1.0, 1.0, 0.0]]), 2).tolist() == [[True, True, False, False]]
    assert topk_sample_mask(torch.tensor([[0.0, 0.0, 0.0, 0.0]]), 1).tolist() == [[True, False, False, False]]
    assert topk_sample_mask(torch.tensor([[0.0, 0.5, 0.2, 0.9]]), 4).all()
    rewards = torch.tensor([[0.0, 0.5, 0.2, 0.9], [3.0, 2.0, 1.0, 3.0]])
    assert topk_sample_mask(rewards, 1).tolist() == [[False, False, False, True], [True, False, False, False]]
    for bad in (0, 5):
        with pytest.raises(ValueError):
            topk_sample_mask(rewards, bad)


def test_sample_loss_mask_truncation_and_topk():
    truncated = torch.tensor([[False, True, False, True]])
    rewards = torch.tensor([[1.0, 1.0, 0.0, 0.0]])
    assert sample_loss_mask(truncated, rewards, False, None).tolist() == [[1, 1, 1, 1]]
    assert sample_loss_mask(truncated, rewards, True, None).tolist() == [[1, 0, 1, 0]]
    assert sample_loss_mask(truncated, rewards, False, 2).tolist() == [[1, 1, 0, 0]]
    # top-2 picks samples 0 and 1, then the truncation filter removes sample 1
    assert sample_loss_mask(truncated, rewards, True, 2).tolist() == [[1, 0, 0, 0]]
    # an all-truncated group leaves the loss entirely
    assert sample_loss_mask(torch.ones(1, 4, dtype=torch.bool), rewards, True, None).sum() == 0


def group(rewards, lengths, finish, correct=None):
    return RolloutGroup(prompt_ids=[1, 2], responses=[[5] * n for n in lengths], logprobs=[[0.0] * n for n in lengths],
                        rewards=rewards,
                        correct=correct or [r == 1.0 for r in rewards], format_ok=[True] * len(rewards),
                        finish_reasons=finish, policy_version=0)


def test_dapo_shaping_then_advantages_by_hand():
    """Overlong punishment is added to the raw reward before the group advantages (DAPO eq. 13)."""
    dapo = GroupConfig(soft_over_length_punishment=True, cache_length=2, filter_truncated_response=True)
    g = group([1.0, 1.0, 0.1, 0.0], [6, 7, 8, 5], ["stop", "stop", "length", "stop"])
    rewards, adv, mask = shaped_group_tensors([g], dapo, max_new_tokens=8)
    # penalties (0, -0.5, -1, 0) -> shaped (1.0, 0.5, -0.9, 0.0); mean 0.15
    assert close(rewards, [[1.0, 0.5, -0.9, 0.0]], 1e-6)
    # deviations (0.85, 0.35, -1.05, -0.15); unbiased var = 1.97 / 3; std = 0.810350
    std = math.sqrt(1.97 / 3)
    assert close(adv, [[0.85 / std, 0.35 / std, -1.05 / std, -0.15 / std]])
    assert mask.tolist() == [[1.0, 1.0, 0.0, 1.0]]  # the truncated sample leaves the loss
    assert g.rewards == [1.0, 1.0, 0.1, 0.0]  # raw rewards untouched for metrics


def test_shaping_off_reproduces_plain_grpo_and_pg():
    g = group([1.0, 0.0, 0.0, 1.0], [6, 7, 8, 5], ["stop", "stop", "length", "stop"])
    rewards, adv, mask = shaped_group_tensors([g], GroupConfig(), max_new_tokens=8)
    assert close(adv, [[0.866025, -0.866025, -0.866025, 0.866025]]) and mask.all()
    _, adv, _ = shaped_group_tensors([g], GroupConfig(advantage="group_mean"), max_new_tokens=8)
    assert close(adv, [[0.5, -0.5, -0.5, 0.5]])
    _, _, mask = shaped_group_tensors([g], GroupConfig(topk_samples=1), max_new_tokens=8)
    assert mask.tolist() == [[1.0, 0.0, 0.0, 0.0]]


def test_all_truncated_group_has_no_sample_in_the_loss():
    dapo = GroupConfig(soft_over_length_punishment=True, cache_length=2, filter_truncated_response=True)
    g = group([0.0, 0.1, 0.0, 0.1], [8, 8, 8, 8], ["length"] * 4)
    rewards, adv, mask = shaped_group_tensors([g], dapo, max_new_tokens=8)
    assert close(rewards, [[-1.0, -0.9, -1.0, -0.9]], 1e-6)
    assert mask.sum() == 0


# --- the estimator registry and the token-level RLHF pieces ---

def test_registry_dispatches_by_name_and_rejects_duplicates():
    assert adv_estimator_names("group") == ("group_norm", "group_mean", "rloo")
    assert adv_estimator_names("token_values") == ("gae",)
    assert get_adv_estimator("group_norm").fn is group_advantages
    with pytest.raises(ValueError, match="already registered"):
        register_adv_est("group_norm")(lambda rewards: rewards)
    with pytest.raises(ValueError, match="needs per-token rewards"):
        compute_advantages(torch.zeros(1, 2), "gae")


def test_last_token_index():
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    assert last_token_index(mask).tolist() == [2, 0, -1]


def test_kl_penalised_rewards_by_hand():
    kl = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.5, 0.5, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    rewards = kl_penalised_rewards(kl, mask, torch.tensor([3.0, -0.5, 5.0]), beta=0.1, score_clip=2.0)
    # row 0: -0.1 * (0.2, 0.3) on its two response tokens, the score 3 clamped to 2 on the last: -0.03 + 2
    # row 1: one response token: -0.05 + (-0.5); row 2: no response token, no reward at all
    assert close(rewards, [[0.0, -0.02, 1.97, 0.0], [-0.55, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]], 1e-6)
    unclamped = kl_penalised_rewards(kl, mask, torch.tensor([3.0, -0.5, 5.0]), beta=0.0)
    assert close(unclamped, [[0.0, 0.0, 3.0, 0.0], [-0.5, 0.0, 0.0, 0.0], [0.0] * 4], 1e-6)


# One row: a prompt position, three response tokens, a padding slot. Masked slots hold garbage (9, 5).
GAE_REWARDS = torch.tensor([[9.0, 0.0, 0.0, 1.0, 9.0]])
GAE_VALUES = torch.tensor([[5.0, 0.5, 0.6, 0.7, 5.0]])
GAE_MASK = torch.tensor([[0.0, 1.0, 1.0, 1.0, 0.0]])


def test_gae_by_hand():
    adv, returns = gae(GAE_REWARDS, GAE_VALUES, GAE_MASK, gamma=0.9, lam=0.8)
    # t=3: delta = 1 + 0.9*0 - 0.7 = 0.3 (the episode ends), A = 0.3
    # t=2: delta = 0 + 0.9*0.7 - 0.6 = 0.03, A = 0.03 + 0.9*0.8*0.3 = 0.246
    # t=1: delta = 0 + 0.9*0.6 - 0.5 = 0.04, A = 0.04 + 0.72*0.246 = 0.21712
    assert close(adv, [[0.0, 0.21712, 0.246, 0.3, 0.0]], 1e-6)
    assert close(returns, [[0.0, 0.71712, 0.846, 1.0, 0.0]], 1e-6)  # A + V
    # lam = 1: returns are the discounted reward-to-go (1, 0.9, 0.81); lam = 0: A is the TD error
    _, returns = gae(GAE_REWARDS, GAE_VALUES, GAE_MASK, gamma=0.9, lam=1.0)
    assert close(returns, [[0.0, 0.81, 0.9, 1.0, 0.0]], 1e-6)
    assert close(discounted_returns(GAE_REWARDS, GAE_MASK, gamma=0.9), [[0.0, 0.81, 0.9, 1.0, 0.0]], 1e-6)
    adv, _ = gae(GAE_REWARDS, GAE_VALUES, GAE_MASK, gamma=0.9, lam=0.0)
    assert close(adv, [[0.0, 0.04, 0.03, 0.3, 0.0]], 1e-6)
    assert get_adv_estimator("gae").fn is gae


def test_gae_steps_over_a_gap_in_the_mask():
    # the masked middle slot (e.g. a tool's output inside the response) is skipped, not an episode end:
    # t=2: A = 1 - 0.7 = 0.3; t=0: delta = 0 + 0.7 - 0.5 = 0.2, A = 0.2 + 0.3 = 0.5 (gamma = lam = 1)
    adv, returns = gae(torch.tensor([[0.0, 9.0, 1.0]]), torch.tensor([[0.5, 9.0, 0.7]]),
                       torch.tensor([[1.0, 0.0, 1.0]]), gamma=1.0, lam=1.0)
    assert close(adv, [[0.5, 0.0, 0.3]], 1e-6) and close(returns, [[1.0, 0.0, 1.0]], 1e-6)


def test_rows_are_independent_in_gae():
    rewards = torch.cat([GAE_REWARDS, torch.tensor([[0.0, 2.0, 0.0, 0.0, 0.0]])])
    values = torch.cat([GAE_VALUES, torch.zeros(1, 5)])
    mask = torch.cat([GAE_MASK, torch.tensor([[0.0, 1.0, 0.0, 0.0, 0.0]])])
    adv, _ = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    assert close(adv[0], [0.0, 0.21712, 0.246, 0.3, 0.0], 1e-6) and close(adv[1], [0.0, 2.0, 0.0, 0.0, 0.0])


def test_masked_whiten_by_hand():
    values = torch.tensor([[1.0, 2.0], [3.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    # masked entries 1, 2, 3: mean 2, unbiased variance (1 + 0 + 1) / 2 = 1; the 100 plays no part
    assert masked_mean(values, mask) == 2.0 and masked_var(values, mask) == 1.0
    assert masked_var(values, mask, unbiased=False) == pytest.approx(2 / 3)
    assert close(masked_whiten(values, mask), [[-1.0, 0.0], [1.0, 0.0]], 1e-6)
    assert close(masked_whiten(values, mask, shift_mean=False), [[1.0, 2.0], [3.0, 0.0]], 1e-6)
    assert masked_var(torch.tensor([[4.0]]), torch.ones(1, 1)) == 0  # one entry: no spread


# --- REINFORCE++: normalised over the whole batch's tokens ---

def per_token_whiten(values, lengths):
    """verl's recipe spelled out: every response's value copied onto each of its tokens, whitened over all tokens
    of the batch (numpy: mean, Bessel-corrected variance), each response read back from its first token."""
    import numpy as np

    tokens = np.concatenate([np.full(int(n), float(v)) for v, n in zip(values.flatten(), lengths.flatten())])
    return (values.double() - tokens.mean()) / math.sqrt(tokens.var(ddof=1) + 1e-8)


def test_reinforce_plus_plus_by_hand():
    rewards, lengths = torch.tensor([[1.0, 0.0], [0.0, 0.0]]), torch.tensor([[1.0, 3.0], [2.0, 2.0]])
    # 8 tokens: mean 1/8, variance (0.875^2 + 7 x 0.125^2) / 7 = 0.125, std 0.353553
    expected = [[0.875 / 0.353553, -0.125 / 0.353553], [-0.125 / 0.353553, -0.125 / 0.353553]]
    got = compute_advantages(rewards, "reinforce_plus_plus", lengths)
    assert close(got, expected, 1e-5) and close(got, per_token_whiten(rewards, lengths).tolist(), 1e-5)


def test_reinforce_plus_plus_baseline_by_hand():
    rewards, lengths = torch.tensor([[1.0, 0.0], [1.0, 1.0]]), torch.tensor([[1.0, 3.0], [2.0, 2.0]])
    # minus the group means: (0.5, -0.5), (0, 0); over 8 tokens mean -1/8, variance 0.125 again
    got = compute_advantages(rewards, "reinforce_plus_plus_baseline", lengths)
    assert close(got, [[0.625 / 0.353553, -0.375 / 0.353553], [0.125 / 0.353553, 0.125 / 0.353553]], 1e-5)
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    assert close(got, per_token_whiten(centred, lengths).tolist(), 1e-5)
    # a group of one keeps its reward (verl's rule): whitened [1, 0] over one token each
    singles = compute_advantages(torch.tensor([[1.0], [0.0]]), "reinforce_plus_plus_baseline", torch.ones(2, 1))
    assert close(singles, [[0.5 / math.sqrt(0.5)], [-0.5 / math.sqrt(0.5)]], 1e-5)


def test_batch_estimators_need_the_lengths_and_are_of_the_group_family():
    from coati.config.algo import estimator_family

    assert adv_estimator_names("batch") == ("reinforce_plus_plus", "reinforce_plus_plus_baseline")
    assert estimator_family("reinforce_plus_plus") == "group"
    with pytest.raises(ValueError, match="needs the response lengths"):
        compute_advantages(torch.zeros(1, 2), "reinforce_plus_plus")
