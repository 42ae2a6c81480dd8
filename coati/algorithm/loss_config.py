"""The policy loss's settings (torch-free, so that coati/config can hold them); the losses are policy_losses.py."""

from __future__ import annotations

from dataclasses import dataclass

from coati.algorithm.registry import KL_ESTIMATORS, LOSS_AGGREGATIONS
from coati.utils.dataclass_cli import option, setting

CORRECTIONS = ("behaviour", "decoupled")


@dataclass(frozen=True)
class PolicyLossConfig:
    """The policy loss's knobs; every field is a --grpo-config key (coati/config/grpo_config.py), options also
    flags."""

    clip_eps_low: float = setting(0.2, "the ratio is clipped below at 1 - clip_eps_low (<= 1; 1: no lower bound)")
    clip_eps_high: float = setting(0.2, "the ratio is clipped above at 1 + clip_eps_high (DAPO's clip-higher: 0.28)")
    kl_loss_coef: float = option(
        0.0, "weight of the KL to the initial model (the kl_estimator key's, k3 unless set), a term of the loss "
             "(the group algorithms: -a GRPO, DAPO, ...); default: 0 (no reference model), as in every preset",
        "-kl", "--kl-coeff", keys=("beta",), resolved=True, metavar="COEF",
        family="group", instead="--kl-reward-coef (the KL penalty in the reward)")
    loss_variation: str = setting(
        "sample_level", "the aggregation, by registered name (" + ", ".join(LOSS_AGGREGATIONS) + "): token_level "
                        "(mean over the batch's tokens), sample_level (mean per sample, then over samples), sample_sum "
                        "(sum per sample, mean over samples), sample_sum_norm (sum over tokens / (samples x L_max): "
                        "Dr.GRPO)")
    objective: str = setting("ppo_clip", "the policy loss, by registered name")
    kl_estimator: str = setting("k3", "the estimator of the loss's KL term (" + ", ".join(KL_ESTIMATORS) + "): k3 "
                                      "exp(ref - logp) - (ref - logp) - 1, k2 0.5 (logp - ref)^2, k1 logp - ref")
    skip_threshold: float | None = setting(None, "drop a sample whose mean importance ratio exceeds this (> 1); "
                                                 "null: off")
    correction: str = option(
        "behaviour", "behaviour: PPO ratio against the producer's logprobs; decoupled: ratio against the trainer's "
                     "policy at the start of the step, each token weighted by min(pi_prox / pi_behaviour, --tis-cap). "
                     "Default: behaviour (with one optimizer step per batch, decoupled learned clearly worse under "
                     "-nb: benchmarks/bench_async.py)", flag="--off-policy-correction", choices=CORRECTIONS,
        resolved=True)
    tis_cap: float = option(2.0, "cap C of the truncated importance weight (decoupled correction)", resolved=True)
