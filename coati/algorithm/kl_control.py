"""The KL coefficient beta of RLHF-PPO's KL-in-reward penalty: fixed, or adapted towards a target KL.

The adaptive rule (Ziegler et al. 2019, as TRL, OpenRLHF and verl use it): after a batch of ``n_steps``
samples whose measured KL to the reference is ``kl``, beta *= 1 + clip(kl / target - 1, -0.2, 0.2) *
n_steps / horizon. Beta grows while the policy drifts further than the target and shrinks while it stays
closer; the clip and the horizon bound how fast (at most a factor 1 +- 0.2 per ``horizon`` samples).
"""

from __future__ import annotations

from dataclasses import dataclass

PROPORTIONAL_CLIP = 0.2


def adaptive_kl_coeff(beta: float, kl: float, target: float, horizon: int, n_steps: int) -> float:
    """The next beta of the adaptive controller (pure)."""
    if target <= 0 or horizon <= 0:
        raise ValueError(f"adaptive KL needs target > 0 and horizon > 0, got target={target}, horizon={horizon}")
    error = min(max(kl / target - 1.0, -PROPORTIONAL_CLIP), PROPORTIONAL_CLIP)
    return beta * (1.0 + error * n_steps / horizon)


@dataclass
class KLController:
    """beta and how it moves: ``target`` None keeps it fixed; else the adaptive rule. Its state is ``value``
    (a checkpoint stores it, so a resumed run continues with the same beta)."""

    value: float
    target: float | None = None
    horizon: int = 10000

    def update(self, kl: float, n_steps: int) -> float:
        if self.target is not None:
            self.value = adaptive_kl_coeff(self.value, kl, self.target, self.horizon, n_steps)
        return self.value
