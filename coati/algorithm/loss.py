"""Pure policy losses. Inputs are per-token tensors of shape [batch, T] with a 0/1 ``mask`` of valid tokens.

Micro-batching is exact: each function takes the ``normaliser`` of the whole (mini)batch, so summing the
losses of micro-batches gives the loss of the batch, and so do the gradients.
- token_level: sum of token losses over the batch / number of valid tokens in the batch.
- sample_level: per-sample mean over its tokens, then sum / number of samples (with a valid token) in the batch.

Objectives (``PolicyLossConfig.objective``) form a registry of pure per-token functions
(rows of ``coati.algorithm.registry.POLICY_LOSSES``; ``@register_policy_loss`` at run time), chosen by name; each returns the per-token loss and where the clip binds:
- ``ppo_clip`` (GRPO, DAPO, PPO): -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A) per token.
- ``reinforce`` (PG): -A * logp per token: no importance ratio, no clipping.
Value losses (PPO's critic) are a registry too (``@register_value_loss``): ``clipped``
0.5 * max((V - R)^2, (V_clip - R)^2) with V_clip = V_old + clip(V - V_old, -eps, eps), and ``mse`` 0.5 (V - R)^2.
The supervised stages' losses live here as well: ``completion_nll`` (SFT) and ``bradley_terry_loss`` (reward model).

``skip_threshold``: the importance ratio of a *sample* is the mean of its per-token ratios
exp(logp - old_logp) over its valid tokens; a sample whose ratio exceeds the threshold is dropped from the
loss (its mask is zeroed) and counted. The normaliser is fixed before the forward pass (micro-batching
stays exact), so a skipped sample still counts in the denominator: it contributes zero, it does not
re-weight the others.

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
from typing import Callable

import torch
import torch.nn.functional as F

from coati.algorithm.loss_config import CORRECTIONS, LOSS_VARIATIONS, PolicyLossConfig  # noqa: F401
from coati.algorithm.registry import POLICY_LOSSES, get_policy_loss, register_policy_loss, registrar  # noqa: F401

# Statistics that are maxima over the step (not sums over micro-batches, not means over ranks).
MAX_STATS = ("is_weight_max", "mismatch_max_abs")

# name -> fn(values, old_values, returns, clip_eps) -> (per-token loss, clipped indicator)
VALUE_LOSSES: dict[str, Callable] = {}


def register_value_loss(name: str):
    """Decorator: make ``fn`` the value loss called ``name``."""
    return registrar(VALUE_LOSSES, "value loss")(name)


def get_value_loss(name: str) -> Callable:
    if name not in VALUE_LOSSES:
        raise ValueError(f"unknown value loss {name!r}; choose one of {tuple(VALUE_LOSSES)}")
    return VALUE_LOSSES[name]


def kl_k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k1 estimator of KL(pi || ref): logp - ref (unbiased, may be negative; the usual choice for
    the KL-in-reward penalty of RLHF-PPO)."""
    return logprobs - ref_logprobs


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(pi || ref): exp(ref - logp) - (ref - logp) - 1, always >= 0."""
    log_ratio = ref_logprobs - logprobs
    return torch.exp(log_ratio) - log_ratio - 1.0


def clipped_surrogate(logprobs, old_logprobs, advantages, eps_low: float, eps_high: float):
    """Per-token PPO-clip objective to *minimise* and a per-token 'was clipped' indicator.

    ``advantages`` is [batch] (one per sample) or [batch, T].
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * advantages
    loss = -torch.minimum(unclipped, clipped)
    return loss, (clipped < unclipped).float()


def clip_indicators(ratio: torch.Tensor, advantages: torch.Tensor, eps_low: float, eps_high: float):
    """Per-token 0/1 tensors (low, high): where the clip actually binds in ``clipped_surrogate``.

    low: A < 0 and ratio < 1 - eps_low (the objective stops rewarding pushing a bad token down);
    high: A > 0 and ratio > 1 + eps_high (it stops rewarding pushing a good token up). Their sum is the
    'was clipped' indicator of ``clipped_surrogate``.
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    low = (advantages < 0) & (ratio < 1.0 - eps_low)
    high = (advantages > 0) & (ratio > 1.0 + eps_high)
    return low.float(), high.float()


def reinforce_surrogate(logprobs: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """Vanilla policy gradient: per-token -A * logp (to minimise)."""
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    return -advantages * logprobs


def ppo_clip_objective(logprobs, anchor, advantages, config: PolicyLossConfig):
    per_token, _ = clipped_surrogate(logprobs, anchor, advantages, config.clip_eps_low, config.clip_eps_high)
    low, high = clip_indicators(torch.exp(logprobs.detach() - anchor), advantages,
                                config.clip_eps_low, config.clip_eps_high)
    return per_token, low, high


def reinforce_objective(logprobs, anchor, advantages, config: PolicyLossConfig):
    zeros = torch.zeros_like(logprobs)
    return reinforce_surrogate(logprobs, advantages), zeros, zeros


def sample_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[batch] importance ratio per sample: mean of exp(logp - old_logp) over its valid tokens (1 if none)."""
    mask = mask.to(logprobs.dtype)
    ratio = torch.exp(logprobs - old_logprobs) * mask
    count = mask.sum(dim=1)
    return torch.where(count > 0, ratio.sum(dim=1) / count.clamp(min=1.0), torch.ones_like(count))


def skip_mask(logprobs, old_logprobs, mask, threshold: float | None) -> torch.Tensor:
    """[batch] bool: samples with at least one valid token whose ``sample_ratio`` exceeds ``threshold``."""
    if threshold is None:
        return torch.zeros(mask.shape[0], dtype=torch.bool, device=mask.device)
    has_tokens = mask.sum(dim=1) > 0
    return has_tokens & (sample_ratio(logprobs.detach(), old_logprobs, mask) > threshold)


def truncated_importance_weight(prox_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor,
                                cap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token (min(exp(prox - behaviour), cap), 1 where the cap binds); no gradient flows through either."""
    ratio = torch.exp(prox_logprobs.detach() - behaviour_logprobs.detach())
    return ratio.clamp(max=cap), (ratio > cap).to(ratio.dtype)


def masked_max(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Largest of ``values`` where ``mask`` is set (0 when nothing is)."""
    masked = torch.where(mask > 0, values, torch.full_like(values, float("-inf")))
    return masked.max().clamp(min=0.0) if mask.any() else values.new_zeros(())


ENTROPY_CHUNK_BYTES = 64 * 2**20  # float32 logits per slice of token_entropy's work


def token_entropy(logits: torch.Tensor, temperature: float = 1.0,
                  chunk_bytes: int = ENTROPY_CHUNK_BYTES) -> torch.Tensor:
    """Entropy of the next-token distribution at every position of ``logits[:, :-1]``: shape [B, L-1].

    Aligned with ``token_logprobs`` (and so with ``action_mask``); computed in float32, no gradient. It is a
    metric taken beside the loss, so it works through the logits a slice of about ``chunk_bytes`` (as float32)
    at a time: done at once, its float32 copy, log-softmax, exp and product would be four more copies of the
    logits at the forward's peak (measured: 2-2.5x the float32 logits above what the loss itself holds), the
    largest tensors of a step at real vocabulary sizes.
    """
    rows, positions, vocab = logits.shape[0], logits.shape[1] - 1, logits.shape[-1]
    out = torch.empty(rows, positions, dtype=torch.float32, device=logits.device)
    with torch.no_grad():
        for row_slice, position_slice in _entropy_slices(rows, positions, 4 * vocab, chunk_bytes):
            piece = logits[row_slice, position_slice].float()
            if temperature != 1.0:
                piece = piece / temperature
            log_p = torch.log_softmax(piece, dim=-1)
            out[row_slice, position_slice] = -(log_p.exp() * log_p).sum(dim=-1)
    return out


def _entropy_slices(rows: int, positions: int, position_bytes: int, chunk_bytes: int):
    """(rows, positions) slices covering a [rows, positions] grid, each about ``chunk_bytes`` of
    ``position_bytes`` each: whole rows when a row fits, else parts of one row."""
    row_bytes = positions * position_bytes
    if row_bytes <= chunk_bytes:
        step = max(1, chunk_bytes // max(row_bytes, 1))
        return [(slice(r, r + step), slice(0, positions)) for r in range(0, rows, step)]
    step = max(1, chunk_bytes // position_bytes)
    return [(slice(r, r + 1), slice(p, min(p + step, positions)))
            for r in range(rows) for p in range(0, positions, step)]


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, variation: str, normaliser: float) -> torch.Tensor:
    """Reduce per-token values to this micro-batch's share of the batch loss (see module docstring)."""
    mask = mask.to(per_token.dtype)
    if variation == "token_level":
        return (per_token * mask).sum() / normaliser
    if variation == "sample_level":
        per_sample = (per_token * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
        return per_sample.sum() / normaliser
    raise ValueError(f"unknown loss variation {variation!r}; choose one of {LOSS_VARIATIONS}")


def batch_normaliser(mask: torch.Tensor | list[torch.Tensor], variation: str) -> float:
    """The denominator ``aggregate`` needs for a whole batch whose valid-token mask is ``mask``.

    token_level: valid tokens; sample_level: samples with at least one valid token (a sample masked out
    entirely, e.g. a truncated response under filter_truncated_response, does not count). At least 1.
    ``mask`` may be a list of the masks of a batch's minibatches (their widths may differ).
    """
    masks = mask if isinstance(mask, (list, tuple)) else [mask]
    return normaliser_from_counts(torch.cat([m.sum(dim=1).reshape(-1) for m in masks]), variation)


def normaliser_from_counts(valid_tokens: torch.Tensor, variation: str) -> float:
    """``batch_normaliser`` from the number of valid tokens of every sample of the batch."""
    if variation == "token_level":
        return max(float(valid_tokens.sum()), 1.0)
    if variation == "sample_level":
        return max(float((valid_tokens > 0).sum()), 1.0)
    raise ValueError(f"unknown loss variation {variation!r}; choose one of {LOSS_VARIATIONS}")


def policy_loss(logprobs, old_logprobs, advantages, mask, config: PolicyLossConfig, normaliser: float,
                ref_logprobs: torch.Tensor | None = None,
                prox_logprobs: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GRPO/DAPO/PG loss of one micro-batch and detached per-batch statistics (summed, same normaliser).

    ``old_logprobs``: the behaviour policy's (the producer's). ``prox_logprobs``: the trainer's at the start of
    the step (default: ``logprobs`` detached, exact when the batch gets one optimizer step).
    Statistics: loss, clip_fraction (= clip_fraction_low + clip_fraction_high), kl_behaviour (k3 of the
    current policy against the behaviour policy), kl (to the reference, only when kl_loss_coef > 0), skipped_samples
    (a count, not normalised), is_weight / is_truncated (mean truncated importance weight, fraction capped),
    mismatch_k3 (k3 of proximal vs behaviour), and the maxima is_weight_max and mismatch_max_abs.
    """
    if config.correction not in CORRECTIONS:
        raise ValueError(f"unknown off-policy correction {config.correction!r}; choose one of {CORRECTIONS}")
    prox = logprobs.detach() if prox_logprobs is None else prox_logprobs.detach()
    decoupled = config.correction == "decoupled"
    anchor = prox if decoupled else old_logprobs  # what the ratio is taken against
    skipped = skip_mask(logprobs, anchor, mask, config.skip_threshold)
    mask = mask * (~skipped).to(mask.dtype).unsqueeze(1)
    variation = config.loss_variation
    per_token, low, high = get_policy_loss(config.objective)(logprobs, anchor, advantages, config)
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
        if ref_logprobs is None:
            raise ValueError("kl_loss_coef > 0 needs reference logprobs")
        kl = kl_k3(logprobs, ref_logprobs)
        per_token = per_token + config.kl_loss_coef * kl
        stats["kl"] = aggregate(kl, mask, variation, normaliser).detach()
    loss = aggregate(per_token, mask, variation, normaliser)
    stats["loss"] = loss.detach()
    return loss, stats


# --- complete policy losses: one function each, written over the helpers above ---

@dataclass(frozen=True)
class LossInputs:
    """What a policy loss reads of one micro-batch; per-token tensors are [batch, T].

    ``old_logprobs``: the behaviour policy's (the producer's). ``prox_logprobs``: the trainer's at the start of
    the step (None: ``logprobs`` detached, exact when the batch gets one optimizer step). ``advantages``: [batch]
    (one per sample) or [batch, T]. ``mask``: the valid tokens (the sample mask already folded in).
    ``normaliser``: the whole (mini)batch's denominator of the aggregation, so that micro-batches add up.
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


def token_ratio(logprobs: torch.Tensor, anchor: torch.Tensor) -> torch.Tensor:
    """Per-token importance ratio exp(logp - anchor)."""
    return torch.exp(logprobs - anchor)


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
    """How a loss ends once it has its corrected per-token surrogate and where its clip binds: the KL term to
    the reference when ``kl_loss_coef`` > 0, the aggregation, and the detached statistics every loss reports
    (module docstring of ``policy_loss``)."""
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
        kl = kl_k3(inputs.logprobs, inputs.ref_logprobs)
        per_token = per_token + config.kl_loss_coef * kl
        stats["kl"] = aggregate(kl, mask, variation, normaliser).detach()
    loss = aggregate(per_token, mask, variation, normaliser)
    stats["loss"] = loss.detach()
    return loss, stats


def ppo_clip_loss(inputs: LossInputs, config: PolicyLossConfig):
    """PPO-clip (GRPO, DAPO, PPO): per token -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A), r = exp(logp - anchor)."""
    off = off_policy(inputs, config)
    per_token, _ = clipped_surrogate(inputs.logprobs, off.anchor, inputs.advantages, config.clip_eps_low,
                                     config.clip_eps_high)
    low, high = clip_indicators(token_ratio(inputs.logprobs.detach(), off.anchor), inputs.advantages,
                                config.clip_eps_low, config.clip_eps_high)
    return complete_loss(off.correct(per_token), low, high, inputs, config, off)


def reinforce_loss(inputs: LossInputs, config: PolicyLossConfig):
    """REINFORCE (PG): per token -A * logp; no ratio, no clip."""
    off = off_policy(inputs, config)
    zeros = torch.zeros_like(inputs.logprobs)
    return complete_loss(off.correct(reinforce_surrogate(inputs.logprobs, inputs.advantages)), zeros, zeros, inputs,
                         config, off)


@register_value_loss("clipped")
def clipped_value_loss(values, old_values, returns, clip_eps: float):
    """Per token 0.5 * max((V - R)^2, (V_clip - R)^2), V_clip = V_old + clip(V - V_old, -eps, eps) (PPO's
    value clipping: the critic cannot gain by moving further than eps from the rollout's values); and 1
    where the clipped term is the larger."""
    clipped = old_values + (values - old_values).clamp(-clip_eps, clip_eps)
    unclipped_sq, clipped_sq = (values - returns) ** 2, (clipped - returns) ** 2
    return 0.5 * torch.maximum(unclipped_sq, clipped_sq), (clipped_sq > unclipped_sq).float()


@register_value_loss("mse")
def mse_value_loss(values, old_values, returns, clip_eps: float):
    """Per token 0.5 * (V - R)^2 (no clipping)."""
    return 0.5 * (values - returns) ** 2, torch.zeros_like(values)


def value_loss(values, old_values, returns, mask, name: str, clip_eps: float, normaliser: float,
               variation: str = "token_level") -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The critic's loss of one micro-batch (``aggregate``d like the policy loss) and detached statistics."""
    per_token, clipped = get_value_loss(name)(values, old_values, returns, clip_eps)
    loss = aggregate(per_token, mask, variation, normaliser)
    return loss, {"value_loss": loss.detach(), "value_clip_fraction": aggregate(clipped, mask, variation, normaliser)}


def completion_nll(logprobs: torch.Tensor, mask: torch.Tensor, normaliser: float) -> torch.Tensor:
    """SFT: the summed negative log-likelihood of the completion tokens (``mask``) / ``normaliser`` (the
    step's completion tokens, so micro-batches and data-parallel ranks add up to the per-token mean)."""
    return -(logprobs * mask.to(logprobs.dtype)).sum() / normaliser


def bradley_terry_loss(chosen: torch.Tensor, rejected: torch.Tensor, normaliser: float,
                       margin: torch.Tensor | float = 0.0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Reward-model loss: sum over pairs of -log sigmoid(r_chosen - r_rejected - margin) / ``normaliser``
    (the step's pairs), and detached statistics on the same scale: accuracy (a pair counts when r_chosen >
    r_rejected; a tie does not) and the mean margin r_chosen - r_rejected."""
    diff = chosen.float() - rejected.float()
    loss = -F.logsigmoid(diff - margin).sum() / normaliser
    return loss, {"loss": loss.detach(), "accuracy": (diff > 0).float().sum() / normaliser,
                  "reward_margin": diff.detach().sum() / normaliser}
