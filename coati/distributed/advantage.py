"""Pure functions on rewards: group advantages, group filters, reward shaping, sample selection.

No I/O, no state. Rewards are [groups, G] tensors (one row per prompt, G completions each).
"""

from __future__ import annotations

import torch

ADVANTAGE_EPS = 1e-6
ADVANTAGES = ("group_norm", "group_mean")


def group_advantages(rewards: torch.Tensor, eps: float = ADVANTAGE_EPS) -> torch.Tensor:
    """GRPO advantages for rewards of shape [groups, G]: (r - group mean) / (group std + eps).

    The std is the unbiased sample std (as in the GRPO paper's reference code); a group whose rewards are
    all equal gets zero advantage everywhere, so it contributes no policy gradient.
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [groups, G], got shape {tuple(rewards.shape)}")
    rewards = rewards.float()
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True, unbiased=True) if rewards.shape[1] > 1 else torch.zeros_like(mean)
    return (rewards - mean) / (std + eps)


def group_mean_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """REINFORCE with a group-mean baseline (PG): r - group mean, not scaled."""
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [groups, G], got shape {tuple(rewards.shape)}")
    rewards = rewards.float()
    return rewards - rewards.mean(dim=1, keepdim=True)


def compute_advantages(rewards: torch.Tensor, kind: str) -> torch.Tensor:
    if kind == "group_norm":
        return group_advantages(rewards)
    if kind == "group_mean":
        return group_mean_advantages(rewards)
    raise ValueError(f"unknown advantage {kind!r}; choose one of {ADVANTAGES}")


def group_accuracy_in_range(correct: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """Mask over groups whose accuracy (mean of ``correct`` over G) lies within [low, high]."""
    accuracy = correct.float().mean(dim=1)
    return (accuracy >= low) & (accuracy <= high)


def overlong_penalty(lengths: torch.Tensor, max_new_tokens: int, cache_length: int) -> torch.Tensor:
    """DAPO's soft overlong punishment (eq. 13) per response length |y| (tokens, EOS included).

    With L_max = ``max_new_tokens`` and L_cache = ``cache_length``:
    0 when |y| <= L_max - L_cache; (L_max - L_cache - |y|) / L_cache inside the cache window
    (L_max - L_cache < |y| <= L_max), falling linearly to -1 at L_max; -1 beyond L_max.
    """
    if not 0 < cache_length <= max_new_tokens:
        raise ValueError(f"cache_length must lie in [1, max_new_tokens={max_new_tokens}], got {cache_length}")
    lengths = lengths.float()
    expected = float(max_new_tokens - cache_length)
    window = (expected - lengths) / cache_length
    penalty = torch.where(lengths <= expected, torch.zeros_like(lengths), window)
    return torch.where(lengths > max_new_tokens, torch.full_like(lengths, -1.0), penalty)


def topk_sample_mask(rewards: torch.Tensor, k: int) -> torch.Tensor:
    """[groups, G] bool: the ``k`` highest rewards of every group; among equal rewards the lower index wins."""
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [groups, G], got shape {tuple(rewards.shape)}")
    if not 1 <= k <= rewards.shape[1]:
        raise ValueError(f"k must lie in [1, G={rewards.shape[1]}], got {k}")
    order = torch.sort(rewards.float(), dim=1, descending=True, stable=True).indices[:, :k]
    mask = torch.zeros(rewards.shape, dtype=torch.bool)
    return mask.scatter(1, order, True)


def sample_loss_mask(truncated: torch.Tensor, rewards: torch.Tensor, filter_truncated: bool,
                     topk: int | None) -> torch.Tensor:
    """[groups, G] float 0/1: which samples enter the loss.

    ``filter_truncated`` drops responses that hit max_new_tokens without EOS (``truncated`` True);
    ``topk`` keeps only the k highest-reward samples per group (chosen before the truncation filter, so a
    group keeps at most k samples). Advantages are computed on the whole group either way.
    """
    keep = torch.ones(rewards.shape, dtype=torch.bool)
    if topk is not None:
        keep &= topk_sample_mask(rewards, topk)
    if filter_truncated:
        keep &= ~truncated.bool()
    return keep.float()
