"""Pure policy losses. Inputs are per-token tensors of shape [batch, T] with a 0/1 ``mask`` of valid tokens.

Micro-batching is exact: each function takes the ``normaliser`` of the whole (mini)batch, so summing the
losses of micro-batches gives the loss of the batch, and so do the gradients.
- token_level: sum of token losses over the batch / number of valid tokens in the batch.
- sample_level: per-sample mean over its tokens, then sum / number of samples in the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

LOSS_VARIATIONS = ("token_level", "sample_level")


@dataclass(frozen=True)
class PolicyLossConfig:
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.2
    kl_coeff: float = 0.0
    loss_variation: str = "sample_level"


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


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, variation: str, normaliser: float) -> torch.Tensor:
    """Reduce per-token values to this micro-batch's share of the batch loss (see module docstring)."""
    mask = mask.to(per_token.dtype)
    if variation == "token_level":
        return (per_token * mask).sum() / normaliser
    if variation == "sample_level":
        per_sample = (per_token * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
        return per_sample.sum() / normaliser
    raise ValueError(f"unknown loss variation {variation!r}; choose one of {LOSS_VARIATIONS}")


def batch_normaliser(mask: torch.Tensor, variation: str) -> float:
    """The denominator ``aggregate`` needs for a whole batch whose valid-token mask is ``mask``."""
    if variation == "token_level":
        return max(float(mask.sum()), 1.0)
    return float(max(mask.shape[0], 1))


def policy_loss(logprobs, old_logprobs, advantages, mask, config: PolicyLossConfig, normaliser: float,
                ref_logprobs: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GRPO/DAPO loss of one micro-batch and detached per-batch statistics (summed, same normaliser)."""
    per_token, was_clipped = clipped_surrogate(logprobs, old_logprobs, advantages, config.clip_eps_low,
                                               config.clip_eps_high)
    stats = {"clip_fraction": aggregate(was_clipped, mask, config.loss_variation, normaliser).detach()}
    if config.kl_coeff > 0:
        if ref_logprobs is None:
            raise ValueError("kl_coeff > 0 needs reference logprobs")
        kl = kl_k3(logprobs, ref_logprobs)
        per_token = per_token + config.kl_coeff * kl
        stats["kl"] = aggregate(kl, mask, config.loss_variation, normaliser).detach()
    loss = aggregate(per_token, mask, config.loss_variation, normaliser)
    stats["loss"] = loss.detach()
    return loss, stats
