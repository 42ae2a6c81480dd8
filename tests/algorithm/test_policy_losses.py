"""Every registered policy loss is the whole loss, one function each.

1. The registered ``ppo_clip`` and ``reinforce`` give bit for bit the loss, the gradients and the statistics of
   the loss as it was composed before (legacy_policy_loss.py), on random inputs across the settings the
   presets use: clip ranges (DAPO's clip-higher), aggregations, KL on/off, the off-policy corrections with their
   truncated importance weight, the skip threshold, per-sample and per-token advantages, masked samples.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from legacy_policy_loss import legacy_policy_loss

from coati.algorithm.loss import PolicyLossConfig, batch_normaliser
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
