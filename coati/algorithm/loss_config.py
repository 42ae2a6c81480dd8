"""The policy loss's settings (torch-free, so that coati/config can hold them); the losses are loss.py."""

from __future__ import annotations

from dataclasses import dataclass

from coati.utils.dataclass_cli import option, setting

LOSS_VARIATIONS = ("token_level", "sample_level")
CORRECTIONS = ("behaviour", "decoupled")


@dataclass(frozen=True)
class PolicyLossConfig:
    """The policy loss's knobs; every field is a --grpo-config key (coati/config/grpo_config.py), options also
    flags."""

    clip_eps_low: float = setting(0.2, "the ratio is clipped below at 1 - clip_eps_low (< 1)")
    clip_eps_high: float = setting(0.2, "the ratio is clipped above at 1 + clip_eps_high (DAPO's clip-higher: 0.28)")
    kl_loss_coef: float = option(
        0.0, "weight of the k3 KL to the initial model, a term of the loss (-a GRPO/DAPO/PG); default: 0 (no "
             "reference model), as in every preset", "-kl", "--kl-coeff", keys=("beta",), resolved=True, metavar="COEF",
        family="group", instead="--kl-reward-coef (the KL penalty in the reward)")
    loss_variation: str = setting("sample_level", "token_level (mean over the batch's tokens) or sample_level (mean "
                                                  "per sample, then over samples)")
    objective: str = setting("ppo_clip", "the policy objective, by registered name")
    skip_threshold: float | None = setting(None, "drop a sample whose mean importance ratio exceeds this (> 1); "
                                                 "null: off")
    correction: str = option(
        "behaviour", "behaviour: PPO ratio against the producer's logprobs; decoupled: ratio against the trainer's "
                     "policy at the start of the step, each token weighted by min(pi_prox / pi_behaviour, --tis-cap). "
                     "Default: behaviour (with one optimizer step per batch, decoupled learned clearly worse under "
                     "-nb: benchmarks/bench_async.py)", flag="--off-policy-correction", choices=CORRECTIONS,
        resolved=True)
    tis_cap: float = option(2.0, "cap C of the truncated importance weight (decoupled correction)", resolved=True)
