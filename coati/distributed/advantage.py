"""Pure functions on rewards: group-normalised advantages and group filters. No I/O, no state."""

from __future__ import annotations

import torch

ADVANTAGE_EPS = 1e-6


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


def group_accuracy_in_range(correct: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """Mask over groups whose accuracy (mean of ``correct`` over G) lies within [low, high]."""
    accuracy = correct.float().mean(dim=1)
    return (accuracy >= low) & (accuracy <= high)
