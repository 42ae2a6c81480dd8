"""The policy loss as it was composed before each registered loss became the whole loss (issue 42), kept
unchanged as the reference that test_policy_losses.py holds the registered losses to, bit for bit.

Its surrogates, clip indicators, aggregation and KL are copied here so that later edits of
coati.algorithm.loss cannot move the reference; the pure helpers it imports (skip mask, truncated importance
weight, masked max) are unchanged since and tested by hand in test_loss.py.
"""

from __future__ import annotations

import torch

from coati.algorithm.loss import masked_max, skip_mask, truncated_importance_weight


def clipped_surrogate(logprobs, old_logprobs, advantages, eps_low, eps_high):
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * advantages
    return -torch.minimum(unclipped, clipped), (clipped < unclipped).float()


def clip_indicators(ratio, advantages, eps_low, eps_high):
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    low = (advantages < 0) & (ratio < 1.0 - eps_low)
    high = (advantages > 0) & (ratio > 1.0 + eps_high)
    return low.float(), high.float()


def reinforce_surrogate(logprobs, advantages):
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    return -advantages * logprobs


def kl_k3(logprobs, ref_logprobs):
    log_ratio = ref_logprobs - logprobs
    return torch.exp(log_ratio) - log_ratio - 1.0


def aggregate(per_token, mask, variation, normaliser):
    mask = mask.to(per_token.dtype)
    if variation == "token_level":
        return (per_token * mask).sum() / normaliser
    if variation == "sample_level":
        per_sample = (per_token * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
        return per_sample.sum() / normaliser
    raise ValueError(variation)


def ppo_clip_objective(logprobs, anchor, advantages, config):
    per_token, _ = clipped_surrogate(logprobs, anchor, advantages, config.clip_eps_low, config.clip_eps_high)
    low, high = clip_indicators(torch.exp(logprobs.detach() - anchor), advantages,
                                config.clip_eps_low, config.clip_eps_high)
    return per_token, low, high


def reinforce_objective(logprobs, anchor, advantages, config):
    zeros = torch.zeros_like(logprobs)
    return reinforce_surrogate(logprobs, advantages), zeros, zeros


OBJECTIVES = {"ppo_clip": ppo_clip_objective, "reinforce": reinforce_objective}


def legacy_policy_loss(logprobs, old_logprobs, advantages, mask, config, normaliser, ref_logprobs=None,
                       prox_logprobs=None):
    prox = logprobs.detach() if prox_logprobs is None else prox_logprobs.detach()
    decoupled = config.correction == "decoupled"
    anchor = prox if decoupled else old_logprobs
    skipped = skip_mask(logprobs, anchor, mask, config.skip_threshold)
    mask = mask * (~skipped).to(mask.dtype).unsqueeze(1)
    variation = config.loss_variation
    per_token, low, high = OBJECTIVES[config.objective](logprobs, anchor, advantages, config)
    weight, truncated = truncated_importance_weight(prox, old_logprobs, config.tis_cap)
    if decoupled:
        per_token = per_token * weight
    clip_low = aggregate(low, mask, variation, normaliser).detach()
    clip_high = aggregate(high, mask, variation, normaliser).detach()
    valid = mask > 0
    stats = {"clip_fraction": clip_low + clip_high, "clip_fraction_low": clip_low, "clip_fraction_high": clip_high,
             "kl_behaviour": aggregate(kl_k3(logprobs.detach(), old_logprobs), mask, variation, normaliser),
             "skipped_samples": skipped.sum().float(),
             "is_weight": aggregate(weight, mask, variation, normaliser),
             "is_truncated": aggregate(truncated, mask, variation, normaliser),
             "is_weight_max": masked_max(weight, valid),
             "mismatch_k3": aggregate(kl_k3(prox, old_logprobs), mask, variation, normaliser),
             "mismatch_max_abs": masked_max((prox - old_logprobs).abs(), valid)}
    if config.kl_loss_coef > 0:
        kl = kl_k3(logprobs, ref_logprobs)
        per_token = per_token + config.kl_loss_coef * kl
        stats["kl"] = aggregate(kl, mask, variation, normaliser).detach()
    loss = aggregate(per_token, mask, variation, normaliser)
    stats["loss"] = loss.detach()
    return loss, stats
