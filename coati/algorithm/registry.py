"""Name -> function tables that the algorithm's pieces are chosen from (a name is registered once).

The advantage estimators, policy losses, loss aggregations and KL estimators that ship are rows here, each
naming its function as ``"module:function"`` text (imported on first use), so that coati/config reads the names
without torch; a function of your own joins at run time with ``@register_adv_est`` / ``@register_policy_loss``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from coati.registry import resolve
from coati.utils.user_parts import note_row, registrar

# What an estimator reads: a group's rewards; the whole batch's group rewards and response lengths (estimators
# that normalise over the batch); or per-token rewards and a critic's values. The first two are the group family.
ESTIMATOR_INPUTS = ("group", "batch", "token_values")


@dataclass(frozen=True)
class AdvEstimator:
    name: str
    function: str | Callable  # "module:function", or the function itself
    inputs: str = "group"  # one of ESTIMATOR_INPUTS

    @property
    def fn(self) -> Callable:
        return resolve(self.function) if isinstance(self.function, str) else self.function


ADV_ESTIMATORS: dict[str, AdvEstimator] = {est.name: est for est in (
    AdvEstimator("group_norm", "coati.algorithm.advantage:group_advantages"),
    AdvEstimator("group_mean", "coati.algorithm.advantage:group_mean_advantages"),
    AdvEstimator("rloo", "coati.algorithm.advantage:rloo_advantages"),
    AdvEstimator("reinforce_plus_plus", "coati.algorithm.advantage:reinforce_pp_advantages", inputs="batch"),
    AdvEstimator("reinforce_plus_plus_baseline", "coati.algorithm.advantage:reinforce_pp_baseline_advantages",
                 inputs="batch"),
    AdvEstimator("gae", "coati.algorithm.advantage:gae", inputs="token_values"),
)}

# name -> fn(inputs: LossInputs, config: PolicyLossConfig) -> (loss, detached statistics): each the whole loss
# (ratio, off-policy correction, clip, KL term, aggregation), coati/algorithm/policy_losses.py
POLICY_LOSSES: dict[str, str | Callable] = {
    "ppo_clip": "coati.algorithm.policy_losses:ppo_clip_loss",
    "reinforce": "coati.algorithm.policy_losses:reinforce_loss",
    "gspo": "coati.algorithm.policy_losses:gspo_loss",
    "gspo_token": "coati.algorithm.policy_losses:gspo_token_loss",
    "cispo": "coati.algorithm.policy_losses:cispo_loss",
}


@dataclass(frozen=True)
class LossAggregation:
    """How per-token losses become the batch's loss (``loss_variation``), coati/algorithm/loss.py."""

    name: str
    function: str | Callable  # fn(per_token, mask, normaliser) -> this micro-batch's share of the batch loss
    normaliser: str | Callable  # fn(valid tokens of every sample of the batch, L_max) -> the batch's denominator

    @property
    def fn(self) -> Callable:
        return resolve(self.function) if isinstance(self.function, str) else self.function

    @property
    def normaliser_fn(self) -> Callable:
        return resolve(self.normaliser) if isinstance(self.normaliser, str) else self.normaliser


LOSS_AGGREGATIONS: dict[str, LossAggregation] = {agg.name: agg for agg in (
    LossAggregation("token_level", "coati.algorithm.loss:masked_sum", "coati.algorithm.loss:count_tokens"),
    LossAggregation("sample_level", "coati.algorithm.loss:sample_means_sum", "coati.algorithm.loss:count_samples"),
    LossAggregation("sample_sum", "coati.algorithm.loss:masked_sum", "coati.algorithm.loss:count_samples"),
    LossAggregation("sample_sum_norm", "coati.algorithm.loss:masked_sum", "coati.algorithm.loss:count_token_slots"),
)}

# The group stages (coati/algorithm/pipeline.py), each name -> a pure function over [groups, G] tensors:
# reward shapers fn(rewards, data, settings, max_new_tokens) -> rewards; sample masks fn(rewards, data, settings)
# -> bool keep; group filters fn(data, settings) -> bool [groups] keep. The preset's settings turn on the shipped
# ones; GroupConfig's reward_shapers / sample_masks / group_filters add any by name.
REWARD_SHAPERS: dict[str, str | Callable] = {"overlong": "coati.algorithm.pipeline:shape_overlong"}
SAMPLE_MASKS: dict[str, str | Callable] = {"topk": "coati.algorithm.pipeline:mask_topk",
                                           "truncated": "coati.algorithm.pipeline:mask_truncated"}
GROUP_FILTERS: dict[str, str | Callable] = {"accuracy_range": "coati.algorithm.pipeline:filter_accuracy_range"}

# name -> fn(logprobs, ref_logprobs) -> per-token estimate of KL(pi || ref), the loss's KL term (kl_estimator)
KL_ESTIMATORS: dict[str, str | Callable] = {
    "k1": "coati.algorithm.loss:kl_k1",
    "k2": "coati.algorithm.loss:kl_k2",
    "k3": "coati.algorithm.loss:kl_k3",
}


def register_adv_est(name: str, inputs: str = "group"):
    """Decorator: make ``fn`` the advantage estimator called ``name`` (a name is registered once)."""
    if inputs not in ESTIMATOR_INPUTS:
        raise ValueError(f"advantage estimator inputs must be one of {ESTIMATOR_INPUTS}, got {inputs!r}")

    def decorate(fn):
        if name in ADV_ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        ADV_ESTIMATORS[name] = AdvEstimator(name, fn, inputs)
        note_row(f"{__name__}:ADV_ESTIMATORS", "advantage estimator", name, ADV_ESTIMATORS[name], fn)
        return fn

    return decorate


def adv_estimator_names(inputs: str | None = None) -> tuple[str, ...]:
    """Registered names, in registration order; only those reading ``inputs`` when given."""
    return tuple(name for name, est in ADV_ESTIMATORS.items() if inputs is None or est.inputs == inputs)


def get_adv_estimator(name: str) -> AdvEstimator:
    if name not in ADV_ESTIMATORS:
        raise ValueError(f"unknown advantage {name!r}; choose one of {', '.join(ADV_ESTIMATORS)}")
    return ADV_ESTIMATORS[name]


def register_policy_loss(name: str):
    """Decorator: make ``fn`` the policy objective called ``name`` (``PolicyLossConfig.objective``)."""
    return registrar(POLICY_LOSSES, "policy loss", f"{__name__}:POLICY_LOSSES")(name)


def register_kl_estimator(name: str):
    """Decorator: make ``fn(logprobs, ref_logprobs)`` the KL estimator called ``name`` (``kl_estimator``)."""
    return registrar(KL_ESTIMATORS, "KL estimator", f"{__name__}:KL_ESTIMATORS")(name)


def register_loss_aggregation(name: str, normaliser: str | Callable):
    """Decorator: make ``fn(per_token, mask, normaliser)`` the aggregation called ``name`` (``loss_variation``),
    with ``normaliser`` its batch denominator (a function, or a shipped one's name such as ``"token_level"``)."""

    def decorate(fn):
        if name in LOSS_AGGREGATIONS:
            raise ValueError(f"loss aggregation {name!r} is already registered")
        base = LOSS_AGGREGATIONS[normaliser].normaliser if normaliser in LOSS_AGGREGATIONS else normaliser
        LOSS_AGGREGATIONS[name] = LossAggregation(name, fn, base)
        note_row(f"{__name__}:LOSS_AGGREGATIONS", "loss aggregation", name, LOSS_AGGREGATIONS[name], fn)
        return fn

    return decorate


def get_policy_loss(name: str) -> Callable:
    if name not in POLICY_LOSSES:
        raise ValueError(f"unknown objective {name!r}; choose one of {tuple(POLICY_LOSSES)}")
    fn = POLICY_LOSSES[name]
    return resolve(fn) if isinstance(fn, str) else fn


register_reward_shaper = registrar(REWARD_SHAPERS, "reward shaper", f"{__name__}:REWARD_SHAPERS")
register_sample_mask = registrar(SAMPLE_MASKS, "sample mask", f"{__name__}:SAMPLE_MASKS")
register_group_filter = registrar(GROUP_FILTERS, "group filter", f"{__name__}:GROUP_FILTERS")


def group_stage(table: dict, name: str) -> Callable:
    """The function of a group stage's row (REWARD_SHAPERS, SAMPLE_MASKS, GROUP_FILTERS)."""
    fn = table[name]
    return resolve(fn) if isinstance(fn, str) else fn


def get_loss_aggregation(name: str) -> LossAggregation:
    if name not in LOSS_AGGREGATIONS:
        raise ValueError(f"unknown loss variation {name!r}; choose one of {', '.join(LOSS_AGGREGATIONS)}")
    return LOSS_AGGREGATIONS[name]


def get_kl_estimator(name: str) -> Callable:
    if name not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {name!r}; choose one of {', '.join(KL_ESTIMATORS)}")
    fn = KL_ESTIMATORS[name]
    return resolve(fn) if isinstance(fn, str) else fn
