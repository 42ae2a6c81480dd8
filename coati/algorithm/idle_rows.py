"""Rows a policy loss gives no gradient: a step may leave them out of its forward and backward passes and train
exactly as if it had run them.

A group whose samples all scored alike (all right, all wrong) has advantage 0 on every sample, and under a
policy-gradient loss without a KL term such a sample's gradient is exactly 0, whatever the ratio or the clip;
a sample outside the loss (its mask empty: truncated and masked, a padding placeholder) has none under any
loss that honours the mask. Whether the configured loss is such a loss is not declared by it but checked
(``check_idle_rows``): the loss is run on random micro-batches and must give those rows a gradient of exactly 0
and the others a gradient, so a loss of the user's own is checked like the shipped ones.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from coati.algorithm.loss import normaliser_from_counts
from coati.algorithm.policy_losses import LossInputs

# The check's micro-batch: rows 0, 1 and 4 train; rows 2 and 3 have advantage 0; row 5 has an empty mask.
_ADVANTAGES = (1.3, -0.7, 0.0, 0.0, 0.9, -2.0)
_EMPTY = 5
_IDLE = (2, 3, _EMPTY)


@dataclass(frozen=True)
class IdleRows:
    """What the check found of a loss: whether idle rows may skip the step (``inert``), and the loss's statistics
    they add nothing to (``unchanged_stats``: with them left out, these keep the whole step's value; the others
    become sums over the rows trained, which the learner rescales to their mean)."""
    inert: bool
    unchanged_stats: frozenset = frozenset()


def check_idle_rows(policy_loss, config, trials: int = 3) -> IdleRows:
    """Whether ``policy_loss(LossInputs, config)`` gives exactly zero gradient to every row of a micro-batch whose
    advantage is 0 or whose mask is empty, and a gradient to the others, on ``trials`` random micro-batches whose
    ratios reach past the clip (proximal logprobs the current ones, then older ones; reference logprobs given);
    and which of its statistics stay the same when the rows with advantage 0 leave the mask, as a step leaves
    them out."""
    generator = torch.Generator().manual_seed(0)
    rows, tokens = len(_ADVANTAGES), 5
    idle = torch.zeros(rows, dtype=torch.bool)
    idle[list(_IDLE)] = True
    unchanged = None

    def noise(scale: float) -> torch.Tensor:
        return torch.randn(rows, tokens, generator=generator) * scale

    for trial in range(trials):
        logprobs = (noise(0.5) - 1.5).clamp(max=-0.01).requires_grad_(True)
        mask = (torch.rand(rows, tokens, generator=generator) > 0.3).float()
        mask[:, 0] = 1.0
        mask[_EMPTY] = 0.0
        prox = logprobs.detach() if trial == 0 else logprobs.detach() + noise(0.3)
        inputs = LossInputs(logprobs, logprobs.detach() + noise(0.7), torch.tensor(_ADVANTAGES), mask,
                            normaliser_from_counts(mask.sum(dim=1), config.loss_variation, tokens),
                            ref_logprobs=logprobs.detach() + noise(0.3), prox_logprobs=prox)
        loss, stats = policy_loss(inputs, config)
        if not loss.requires_grad:
            return IdleRows(False)
        (gradient,) = torch.autograd.grad(loss, logprobs, allow_unused=True)
        if gradient is None or gradient[idle].abs().max() != 0 or not (gradient[~idle].abs().sum(dim=1) > 0).any():
            return IdleRows(False)
        _, without = policy_loss(replace(inputs, mask=mask * (~idle).float().unsqueeze(1)), config)
        same = {name for name, value in stats.items()
                if name in without and torch.allclose(torch.as_tensor(value).float(),
                                                      torch.as_tensor(without[name]).float(), rtol=1e-6, atol=0)}
        unchanged = same if unchanged is None else unchanged & same
    return IdleRows(True, frozenset(unchanged))
