"""The registered policy losses: each one whole function ``fn(inputs: LossInputs, config: PolicyLossConfig) ->
(loss, statistics)``, from the importance ratio to the aggregated scalar, written over loss.py's pure helpers.
They are rows of ``coati.algorithm.registry.POLICY_LOSSES`` (``--grpo-config '{"objective": "name"}'``); a loss
of your own is one such function under ``@register_policy_loss("name")``.

- ``ppo_clip`` (GRPO, DAPO, Dr.GRPO, PPO): -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A) per token,
  r = pi / pi_anchor per token.
- ``reinforce`` (PG): -A logp per token: no ratio, no clip.
- ``gspo`` (Zheng et al. 2025, "Group Sequence Policy Optimization"; TRL ``importance_sampling_level=
  "sequence"``): the ratio of a whole response, s = exp(mean over its tokens of logp - anchor), clipped at the
  sequence level: -min(s A, clip(s, 1 - eps_low, 1 + eps_high) A) on every token of the response; the
  gradient flows through the mean. The paper's clip ranges are small (3e-4 / 4e-4: the GSPO preset).
- ``gspo_token`` (the paper's GSPO-token; verl ``loss_mode: gspo``): per token s_t = sg(s) pi_t / sg(pi_t),
  the same value as s on every token and, with one advantage per response, the same gradient as ``gspo``;
  it also takes per-token advantages.
- ``cispo`` (MiniMax-M1, 2025; verl ``loss_mode: cispo``, TRL ``loss_type="cispo"``): REINFORCE weighted by
  the clipped, stop-gradient importance weight: -sg(clip(r, 1 - eps_low, 1 + eps_high)) A logp per token; a
  token whose ratio left the band still has a gradient, only a bounded weight.

Every loss shares how it ends (``complete_loss``): the off-policy correction's truncated importance weight
(``off_policy``: under ``decoupled`` the ratio's anchor is the proximal policy and each token is weighted by
min(pi_prox / pi_behaviour, tis_cap)), the skip threshold, the KL term to the reference (``kl_loss_coef``, by
``kl_estimator``), the aggregation (``loss_variation``) and the statistics: loss, clip_fraction (=
clip_fraction_low + clip_fraction_high: where the loss's clip binds), kl_behaviour (k3 of the current policy
against the behaviour policy), kl (to the reference, only when kl_loss_coef > 0), skipped_samples (a count, not
normalised), is_weight / is_truncated (mean truncated importance weight, fraction capped), mismatch_k3 (k3 of
proximal vs behaviour), and the maxima is_weight_max and mismatch_max_abs.

``skip_threshold``: the importance ratio of a *sample* is the mean of its per-token ratios against the anchor
over its valid tokens; a sample whose ratio exceeds the threshold is dropped from the loss (its mask is
zeroed) and counted. The normaliser is fixed before the forward pass (micro-batching stays exact), so a
skipped sample still counts in the denominator: it contributes zero, it does not re-weight the others.

Off-policy correction (``PolicyLossConfig.correction``), for groups sampled by older weights (async mode):
- ``behaviour``: the ratio is taken against the behaviour policy (the producer's logprobs), as in sync PPO.
- ``decoupled`` (decoupled PPO; truncated importance sampling): the ratio is taken against the *proximal*
  policy (the trainer's weights at the start of the step, no gradient) and every token is weighted by the
  truncated importance weight min(pi_prox / pi_behaviour, tis_cap) (no gradient). The trust region is then
  around the trainer's own recent policy, and the weight corrects for the behaviour policy being older.
  ``skip_threshold`` and the clip statistics then refer to the proximal ratio. With one optimizer step per
  batch the proximal policy is the current one, so the ratio is 1 and the clip never binds: tokens the last
  update already pushed up get weights above 1 and are pushed again. Measured on the demo at S = 1 and 2 it
  learned about 12 points worse than ``behaviour``, whose clip against the producer's logprobs stops exactly
  those tokens; so ``behaviour`` is the default (benchmarks/bench_async.py).
Both modes report the importance weights and the behaviour-vs-proximal mismatch (k3 and max |diff|); with
fresh groups the mismatch is the numeric difference of the two engines' logprobs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from coati.algorithm.loss import (
    aggregate,
    clip_indicators,
    clip_surrogate,
    clipped_weight,
    kl_k3,
    masked_max,
    reinforce_surrogate,
    sequence_log_ratio,
    skip_mask,
    token_ratio,
    truncated_importance_weight,
)
from coati.algorithm.loss_config import CORRECTIONS, PolicyLossConfig
from coati.algorithm.registry import get_kl_estimator, get_policy_loss


@dataclass(frozen=True)
class LossInputs:
    """What a policy loss reads of one micro-batch; per-token tensors are [batch, T].

    ``old_logprobs``: the behaviour policy's (the producer's). ``prox_logprobs``: the trainer's at the start of
    the step (None: ``logprobs`` detached, exact when the batch gets one optimizer step). ``advantages``: [batch]
    (one per sample) or [batch, T]. ``mask``: the valid tokens (the sample mask already folded in).
    ``normaliser``: the whole (mini)batch's denominator of the aggregation, so that micro-batches add up.
    ``ref_logprobs``: the reference policy's, when the loss has a KL term.
    """

    logprobs: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    normaliser: float
    ref_logprobs: torch.Tensor | None = None
    prox_logprobs: torch.Tensor | None = None

    @property
    def prox(self) -> torch.Tensor:
        return self.logprobs.detach() if self.prox_logprobs is None else self.prox_logprobs.detach()


@dataclass(frozen=True)
class OffPolicy:
    """The off-policy correction and the skip threshold applied to one micro-batch (module docstring)."""

    anchor: torch.Tensor  # the logprobs the importance ratio is taken against
    mask: torch.Tensor  # the valid tokens, skipped samples removed
    skipped: torch.Tensor  # [batch] bool
    weight: torch.Tensor  # per token min(pi_prox / pi_behaviour, tis_cap), no gradient
    truncated: torch.Tensor  # 1 where the cap binds
    decoupled: bool

    def correct(self, per_token: torch.Tensor) -> torch.Tensor:
        """The per-token loss weighted by the truncated importance weight under the decoupled correction."""
        return per_token * self.weight if self.decoupled else per_token


def off_policy(inputs: LossInputs, config: PolicyLossConfig) -> OffPolicy:
    if config.correction not in CORRECTIONS:
        raise ValueError(f"unknown off-policy correction {config.correction!r}; choose one of {CORRECTIONS}")
    prox = inputs.prox
    decoupled = config.correction == "decoupled"
    anchor = prox if decoupled else inputs.old_logprobs
    skipped = skip_mask(inputs.logprobs, anchor, inputs.mask, config.skip_threshold)
    mask = inputs.mask * (~skipped).to(inputs.mask.dtype).unsqueeze(1)
    weight, truncated = truncated_importance_weight(prox, inputs.old_logprobs, config.tis_cap)
    return OffPolicy(anchor, mask, skipped, weight, truncated, decoupled)


def complete_loss(per_token: torch.Tensor, clip_low: torch.Tensor, clip_high: torch.Tensor, inputs: LossInputs,
                  config: PolicyLossConfig, off: OffPolicy) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """How every loss ends once it has its per-token surrogate (the correction's weight applied) and where its
    clip binds: the KL term to the reference when ``kl_loss_coef`` > 0, the aggregation and the detached
    statistics (module docstring)."""
    mask, variation, normaliser, prox = off.mask, config.loss_variation, inputs.normaliser, inputs.prox
    low = aggregate(clip_low, mask, variation, normaliser).detach()
    high = aggregate(clip_high, mask, variation, normaliser).detach()
    valid = mask > 0
    stats = {"clip_fraction": low + high, "clip_fraction_low": low, "clip_fraction_high": high,
             "kl_behaviour": aggregate(kl_k3(inputs.logprobs.detach(), inputs.old_logprobs), mask, variation,
                                       normaliser),
             "skipped_samples": off.skipped.sum().float(),
             "is_weight": aggregate(off.weight, mask, variation, normaliser),
             "is_truncated": aggregate(off.truncated, mask, variation, normaliser),
             "is_weight_max": masked_max(off.weight, valid),
             "mismatch_k3": aggregate(kl_k3(prox, inputs.old_logprobs), mask, variation, normaliser),
             "mismatch_max_abs": masked_max((prox - inputs.old_logprobs).abs(), valid)}
    if config.kl_loss_coef > 0:
        if inputs.ref_logprobs is None:
            raise ValueError("kl_loss_coef > 0 needs reference logprobs")
        kl = get_kl_estimator(config.kl_estimator)(inputs.logprobs, inputs.ref_logprobs)
        per_token = per_token + config.kl_loss_coef * kl
        stats["kl"] = aggregate(kl, mask, variation, normaliser).detach()
    loss = aggregate(per_token, mask, variation, normaliser)
    stats["loss"] = loss.detach()
    return loss, stats


def policy_loss(inputs: LossInputs, config: PolicyLossConfig) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss ``config.objective`` names, of one micro-batch, and its detached statistics."""
    return get_policy_loss(config.objective)(inputs, config)


def ppo_clip_loss(inputs: LossInputs, config: PolicyLossConfig):
    off = off_policy(inputs, config)
    ratio = token_ratio(inputs.logprobs, off.anchor)
    per_token = clip_surrogate(ratio, inputs.advantages, config.clip_eps_low, config.clip_eps_high)
    low, high = clip_indicators(token_ratio(inputs.logprobs.detach(), off.anchor), inputs.advantages,
                                config.clip_eps_low, config.clip_eps_high)
    return complete_loss(off.correct(per_token), low, high, inputs, config, off)


def reinforce_loss(inputs: LossInputs, config: PolicyLossConfig):
    off = off_policy(inputs, config)
    zeros = torch.zeros_like(inputs.logprobs)
    return complete_loss(off.correct(reinforce_surrogate(inputs.logprobs, inputs.advantages)), zeros, zeros, inputs,
                         config, off)


def gspo_loss(inputs: LossInputs, config: PolicyLossConfig):
    off = off_policy(inputs, config)
    log_ratio = sequence_log_ratio(inputs.logprobs, off.anchor, inputs.mask)  # [batch, 1]
    per_sample = clip_surrogate(torch.exp(log_ratio), inputs.advantages, config.clip_eps_low, config.clip_eps_high)
    low, high = clip_indicators(torch.exp(log_ratio.detach()), inputs.advantages, config.clip_eps_low,
                                config.clip_eps_high)
    shape = inputs.logprobs.shape
    return complete_loss(off.correct(per_sample.expand(shape)), low.expand(shape), high.expand(shape), inputs,
                         config, off)


def gspo_token_loss(inputs: LossInputs, config: PolicyLossConfig):
    off = off_policy(inputs, config)
    log_ratio = sequence_log_ratio(inputs.logprobs.detach(), off.anchor, inputs.mask)
    # value exp(log s) on every token, gradient s * dlogp_t (the detached sequence term added last, as verl does,
    # so that logp - sg(logp) is exactly 0)
    ratio = torch.exp(inputs.logprobs - inputs.logprobs.detach() + log_ratio)
    per_token = clip_surrogate(ratio, inputs.advantages, config.clip_eps_low, config.clip_eps_high)
    low, high = clip_indicators(ratio.detach(), inputs.advantages, config.clip_eps_low, config.clip_eps_high)
    shape = inputs.logprobs.shape
    return complete_loss(off.correct(per_token), low.expand(shape), high.expand(shape), inputs, config, off)


def cispo_loss(inputs: LossInputs, config: PolicyLossConfig):
    off = off_policy(inputs, config)
    weight, low, high = clipped_weight(token_ratio(inputs.logprobs, off.anchor), config.clip_eps_low,
                                       config.clip_eps_high)
    per_token = weight * reinforce_surrogate(inputs.logprobs, inputs.advantages)
    return complete_loss(off.correct(per_token), low, high, inputs, config, off)
