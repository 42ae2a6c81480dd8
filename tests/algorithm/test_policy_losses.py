"""Every registered policy loss is the whole loss, one function each.

1. The registered ``ppo_clip`` and ``reinforce`` give bit for bit the loss, the gradients and the statistics of
   the loss as it was composed before (legacy_policy_loss.py), on random inputs across the settings the
   presets use: clip ranges (DAPO's clip-higher), aggregations, KL on/off, the off-policy corrections with their
   truncated importance weight, the skip threshold, per-sample and per-token advantages, masked samples.
2. GSPO (sequence and token forms), CISPO, the aggregations (Dr.GRPO's constant normaliser) and the KL
   estimators against numbers worked out by hand.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import torch
from legacy_policy_loss import legacy_policy_loss

from coati.algorithm.loss import PolicyLossConfig, aggregate, batch_normaliser, get_kl_estimator
from coati.algorithm.policy_losses import LossInputs, policy_loss


def random_batch(seed: int, per_token_advantages: bool):
    """6 samples x 7 tokens: ratios up to e^{+-0.6} against the behaviour policy, a proximal policy between the
    two, a reference, ragged masks with one sample masked out entirely and one far off-policy."""
    gen = torch.Generator().manual_seed(seed)
    old = torch.randn(6, 7, generator=gen) - 2.0
    logp = old + 0.3 * torch.randn(6, 7, generator=gen)
    logp[1] += 0.4  # a sample far off-policy: its mean ratio exceeds the skip threshold
    prox = old + 0.15 * torch.randn(6, 7, generator=gen)
    ref = old + 0.2 * torch.randn(6, 7, generator=gen)
    adv = torch.randn(6, 7, generator=gen) if per_token_advantages else torch.randn(6, generator=gen)
    lengths = torch.tensor([7, 5, 1, 3, 0, 6])
    mask = (torch.arange(7).unsqueeze(0) < lengths.unsqueeze(1)).float()
    return logp, old, prox, ref, adv, mask


SETTINGS = list(enumerate(itertools.product(
    ("ppo_clip", "reinforce"), ("token_level", "sample_level"), ((0.2, 0.2), (0.2, 0.28)), (0.0, 0.05),
    ("behaviour", "decoupled"), (None, 1.1))))


@pytest.mark.parametrize("seed, setting", SETTINGS)
@pytest.mark.parametrize("per_token_advantages", [False, True])
@pytest.mark.parametrize("with_prox", [False, True])
def test_registered_losses_equal_the_legacy_composition_bit_for_bit(seed, setting, per_token_advantages, with_prox):
    objective, variation, clip, kl, correction, skip = setting
    config = PolicyLossConfig(objective=objective, loss_variation=variation, clip_eps_low=clip[0],
                              clip_eps_high=clip[1], kl_loss_coef=kl, correction=correction, skip_threshold=skip,
                              tis_cap=1.2)
    logp, old, prox, ref, adv, mask = random_batch(seed, per_token_advantages)
    prox = prox if with_prox else None
    normaliser = batch_normaliser(mask, variation)
    a, b = logp.clone().requires_grad_(True), logp.clone().requires_grad_(True)
    want, want_stats = legacy_policy_loss(a, old, adv, mask, config, normaliser, ref_logprobs=ref, prox_logprobs=prox)
    got, got_stats = policy_loss(LossInputs(b, old, adv, mask, normaliser, ref_logprobs=ref, prox_logprobs=prox),
                                 config)
    assert torch.equal(got, want)
    want.backward()
    got.backward()
    assert torch.equal(b.grad, a.grad)
    assert got_stats.keys() == want_stats.keys()
    for name in want_stats:
        assert torch.equal(got_stats[name], want_stats[name]), name
    if skip is not None and correction == "behaviour":
        assert want_stats["skipped_samples"] > 0  # the threshold is exercised, not only off


def test_the_settings_exercise_clipping_and_truncation():
    """Guard against a vacuous comparison: the random batch clips on both sides and caps importance weights."""
    logp, old, prox, ref, adv, mask = random_batch(1, False)
    config = PolicyLossConfig(clip_eps_low=0.2, clip_eps_high=0.28, loss_variation="token_level", tis_cap=1.2)
    _, stats = legacy_policy_loss(logp, old, adv, mask, config, batch_normaliser(mask, "token_level"),
                                  prox_logprobs=prox)
    assert stats["clip_fraction_low"] > 0 and stats["clip_fraction_high"] > 0 and stats["is_truncated"] > 0


# 2. The losses added with issue 42 and the aggregations, against numbers worked out by hand.

def by_hand(logp, old, adv, mask, config, normaliser, **extra):
    logp = logp.clone().requires_grad_(True)
    loss, stats = policy_loss(LossInputs(logp, old, adv, mask, normaliser, **extra), config)
    loss.backward()
    return loss, stats, logp.grad


# Sample 0: A = +1, two valid tokens with ratios 1.2 and 1.0 -> sequence ratio s0 = sqrt(1.2) = 1.0954451.
# Sample 1: A = -1, three valid tokens with ratio 0.5 each and a padding slot -> s1 = 0.5.
OLD = torch.log(torch.tensor([[0.5, 0.4, 0.3, 0.3], [0.6, 0.6, 0.6, 0.2]]))
GSPO_LOGP = OLD + torch.log(torch.tensor([[1.2, 1.0, 1.0, 1.0], [0.5, 0.5, 0.5, 9.0]]))
GSPO_MASK = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]])
SEQ_ADV = torch.tensor([1.0, -1.0])
S0 = math.sqrt(1.2)


def test_gspo_clips_the_sequence_ratio_by_hand():
    config = PolicyLossConfig(objective="gspo", clip_eps_low=0.2, clip_eps_high=0.2)  # sample_level
    loss, stats, grad = by_hand(GSPO_LOGP, OLD, SEQ_ADV, GSPO_MASK, config, 2.0)
    # sample 0: -min(s0, clip(s0)) = -1.0954451 (1.095 < 1.2: not clipped); sample 1: -min(-0.5, -0.8) = 0.8
    # (clipped low); each sample's tokens all carry its value: mean per sample, sum / 2 samples
    assert loss.item() == pytest.approx((-S0 + 0.8) / 2, abs=1e-6)
    # d(-s0)/dlogp_t = -s0 / 2 on each of sample 0's two tokens, / 2 samples; the clipped sample has none
    assert torch.allclose(grad, torch.tensor([[-S0 / 4, -S0 / 4, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]), atol=1e-6)
    assert stats["clip_fraction_low"].item() == pytest.approx(0.5) and stats["clip_fraction_high"].item() == 0
    # the paper's narrow band clips sample 0 too: -(1 + 4e-4), and it has no gradient left
    narrow = PolicyLossConfig(objective="gspo", clip_eps_low=3e-4, clip_eps_high=4e-4)
    loss, stats, grad = by_hand(GSPO_LOGP, OLD, SEQ_ADV, GSPO_MASK, narrow, 2.0)
    assert loss.item() == pytest.approx((-(1 + 4e-4) + (1 - 3e-4)) / 2, abs=1e-6)
    assert grad.abs().sum() == 0 and stats["clip_fraction"].item() == pytest.approx(1.0)


def test_gspo_token_equals_gspo_with_one_advantage_per_response():
    config = PolicyLossConfig(objective="gspo", clip_eps_low=0.2, clip_eps_high=0.2)
    token = PolicyLossConfig(objective="gspo_token", clip_eps_low=0.2, clip_eps_high=0.2)
    for variation in ("sample_level", "token_level"):
        a = by_hand(GSPO_LOGP, OLD, SEQ_ADV, GSPO_MASK, dataclasses.replace(config, loss_variation=variation), 2.0)
        b = by_hand(GSPO_LOGP, OLD, SEQ_ADV, GSPO_MASK, dataclasses.replace(token, loss_variation=variation), 2.0)
        # equal up to rounding: the sequence form differentiates through a mean, the token form does not
        assert torch.allclose(a[0], b[0], atol=1e-6) and torch.allclose(a[2], b[2], atol=1e-6)
        assert torch.equal(a[1]["clip_fraction_low"], b[1]["clip_fraction_low"])


def test_gspo_token_takes_per_token_advantages_by_hand():
    adv = torch.tensor([[1.0, 2.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    config = PolicyLossConfig(objective="gspo_token", clip_eps_low=0.2, clip_eps_high=0.2, loss_variation="token_level")
    loss, _, grad = by_hand(GSPO_LOGP, OLD, adv, GSPO_MASK, config, 5.0)
    # every token's ratio has the value s0; -s0 * A_t for A = (1, 2), / 5 valid tokens; d/dlogp_t = -s0 A_t / 5
    assert loss.item() == pytest.approx(-S0 * 3 / 5, abs=1e-6)
    assert torch.allclose(grad[0], torch.tensor([-S0 / 5, -2 * S0 / 5, 0.0, 0.0]), atol=1e-6)


# CISPO: one sample, A = +1, ratios 2.0, 0.5, 1.0 against old probabilities 0.4, 0.5, 0.5.
CISPO_OLD = torch.log(torch.tensor([[0.4, 0.5, 0.5]]))
CISPO_LOGP = torch.log(torch.tensor([[0.8, 0.25, 0.5]]))
ONE3 = torch.ones(1, 3)


def test_cispo_weights_reinforce_by_the_clipped_stop_gradient_ratio_by_hand():
    config = PolicyLossConfig(objective="cispo", clip_eps_low=0.2, clip_eps_high=0.28, loss_variation="token_level")
    loss, stats, grad = by_hand(CISPO_LOGP, CISPO_OLD, torch.tensor([1.0]), ONE3, config, 3.0)
    # weights clip(2, .8, 1.28) = 1.28, clip(.5) = 0.8, 1.0; loss -w * A * logp per token, / 3 tokens
    weights = [1.28, 0.8, 1.0]
    expected = -sum(w * math.log(p) for w, p in zip(weights, [0.8, 0.25, 0.5])) / 3
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    # the gradient is -w * A / 3 on every token: the clipped tokens keep one (PPO-clip gives the first none)
    assert torch.allclose(grad, torch.tensor([[-1.28 / 3, -0.8 / 3, -1.0 / 3]]), atol=1e-6)
    assert stats["clip_fraction_high"].item() == pytest.approx(1 / 3)
    assert stats["clip_fraction_low"].item() == pytest.approx(1 / 3)
    _, _, ppo_grad = by_hand(CISPO_LOGP, CISPO_OLD, torch.tensor([1.0]), ONE3,
                             dataclasses.replace(config, objective="ppo_clip"), 3.0)
    assert ppo_grad[0, 0] == 0


def test_the_cispo_preset_caps_the_weight_at_five_without_a_lower_bound():
    from coati.config.algo import ALGO_PRESETS

    config = PolicyLossConfig(**ALGO_PRESETS["CISPO"])
    logp = torch.log(torch.tensor([[0.6, 0.01]]))
    old = torch.log(torch.tensor([[0.1, 0.5]]))  # ratios 6 and 0.02
    _, stats, grad = by_hand(logp, old, torch.tensor([-1.0]), torch.ones(1, 2), config, 2.0)
    assert torch.allclose(grad, torch.tensor([[5.0 / 2, 0.02 / 2]]), atol=1e-6)  # -w * A / 2, w = min(r, 5)
    assert stats["clip_fraction_high"].item() == pytest.approx(0.5) and stats["clip_fraction_low"].item() == 0


def test_aggregations_and_their_normalisers_by_hand():
    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])  # the third sample masked out
    expected = {"token_level": (7 / 3, 3.0),  # (1 + 2 + 4) / 3 valid tokens
                "sample_level": ((1.5 + 4) / 2, 2.0),  # sample means 1.5 and 4 / 2 samples with tokens
                "sample_sum": ((3 + 4) / 2, 2.0),  # sample sums 3 and 4 / 2 samples with tokens
                "sample_sum_norm": (7 / 12, 12.0)}  # (1 + 2 + 4) / (3 samples x L_max 4)
    for variation, (value, normaliser) in expected.items():
        assert batch_normaliser(mask, variation, max_length=4) == normaliser, variation
        assert aggregate(per_token, mask, variation, normaliser).item() == pytest.approx(value), variation
    with pytest.raises(ValueError, match="L_max"):
        batch_normaliser(mask, "sample_sum_norm")


def test_dr_grpo_weighs_every_token_alike_whatever_the_length():
    """Dr.GRPO's normaliser: a token of a short response and of a long one get the same gradient, A / (N L_max);
    the GRPO default (sample_level) gives the short response's token three times the weight."""
    logp = torch.full((2, 3), -1.0)
    mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    adv = torch.tensor([1.0, 1.0])
    dr = PolicyLossConfig(loss_variation="sample_sum_norm")
    _, _, grad = by_hand(logp, logp, adv, mask, dr, batch_normaliser(mask, "sample_sum_norm", max_length=4))
    assert torch.allclose(grad, -mask / 8)  # ratio 1: d(-r A)/dlogp = -A, / (2 samples x 4)
    _, _, grad = by_hand(logp, logp, adv, mask, PolicyLossConfig(), batch_normaliser(mask, "sample_level"))
    assert torch.allclose(grad, torch.tensor([[-0.5, 0, 0], [-1 / 6, -1 / 6, -1 / 6]]))


def test_kl_estimators_by_hand_in_the_loss():
    logp, ref = torch.tensor([[0.0, -1.0]]), torch.tensor([[-1.0, 0.0]])
    k1, k2, k3 = (get_kl_estimator(name)(logp, ref) for name in ("k1", "k2", "k3"))
    assert k1.tolist() == [[1.0, -1.0]] and k2.tolist() == [[0.5, 0.5]]
    assert torch.allclose(k3, torch.tensor([[math.exp(-1), math.e - 2]]))
    for name, value in (("k1", 0.0), ("k2", 0.5), ("k3", (math.exp(-1) + math.e - 2) / 2)):
        config = PolicyLossConfig(kl_loss_coef=0.1, kl_estimator=name, loss_variation="token_level")
        loss, stats, _ = by_hand(logp, logp, torch.tensor([0.0]), torch.ones(1, 2), config, 2.0, ref_logprobs=ref)
        assert stats["kl"].item() == pytest.approx(value, abs=1e-6) and loss.item() == pytest.approx(0.1 * value)


@pytest.mark.parametrize("objective", ["gspo", "gspo_token", "cispo"])
@pytest.mark.parametrize("variation", ["token_level", "sample_level", "sample_sum", "sample_sum_norm"])
def test_micro_batches_of_the_new_losses_add_up(objective, variation):
    logp, old, prox, ref, adv, mask = random_batch(3, False)
    config = PolicyLossConfig(objective=objective, loss_variation=variation, kl_loss_coef=0.05, skip_threshold=1.1)
    normaliser = batch_normaliser(mask, variation, max_length=7)
    whole, _ = policy_loss(LossInputs(logp, old, adv, mask, normaliser, ref), config)
    parts = sum(policy_loss(LossInputs(logp[i:i + 2], old[i:i + 2], adv[i:i + 2], mask[i:i + 2], normaliser,
                                       ref[i:i + 2]), config)[0] for i in range(0, 6, 2))
    assert torch.allclose(whole, parts, atol=1e-6)
