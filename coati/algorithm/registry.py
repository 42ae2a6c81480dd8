"""Name -> function tables that the algorithm's pieces are chosen from (a name is registered once).

The advantage estimators and policy objectives that ship are rows here, each naming its function as
``"module:function"`` text (imported on first use), so that coati/config reads the names without torch; a
function of your own joins at run time with ``@register_adv_est`` / ``@register_policy_loss``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from coati.registry import resolve

ESTIMATOR_INPUTS = ("group", "token_values")


def registrar(registry: dict, kind: str) -> Callable[[str], Callable]:
    """``register(name)``: a decorator that files the function under ``name`` in ``registry``."""

    def register(name: str):
        def decorate(fn):
            if name in registry:
                raise ValueError(f"{kind} {name!r} is already registered")
            registry[name] = fn
            return fn

        return decorate

    return register


@dataclass(frozen=True)
class AdvEstimator:
    name: str
    function: str | Callable  # "module:function", or the function itself
    inputs: str = "group"  # one of ESTIMATOR_INPUTS: a group's rewards, or per-token rewards and a critic's values

    @property
    def fn(self) -> Callable:
        return resolve(self.function) if isinstance(self.function, str) else self.function


ADV_ESTIMATORS: dict[str, AdvEstimator] = {est.name: est for est in (
    AdvEstimator("group_norm", "coati.algorithm.advantage:group_advantages"),
    AdvEstimator("group_mean", "coati.algorithm.advantage:group_mean_advantages"),
    AdvEstimator("rloo", "coati.algorithm.advantage:rloo_advantages"),
    AdvEstimator("gae", "coati.algorithm.advantage:gae", inputs="token_values"),
)}

# name -> fn(logprobs, anchor_logprobs, advantages, config) -> (per-token loss, clip_low, clip_high indicators)
POLICY_LOSSES: dict[str, str | Callable] = {
    "ppo_clip": "coati.algorithm.loss:ppo_clip_objective",
    "reinforce": "coati.algorithm.loss:reinforce_objective",
}


def register_adv_est(name: str, inputs: str = "group"):
    """Decorator: make ``fn`` the advantage estimator called ``name`` (a name is registered once)."""
    if inputs not in ESTIMATOR_INPUTS:
        raise ValueError(f"advantage estimator inputs must be one of {ESTIMATOR_INPUTS}, got {inputs!r}")

    def decorate(fn):
        if name in ADV_ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        ADV_ESTIMATORS[name] = AdvEstimator(name, fn, inputs)
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
    return registrar(POLICY_LOSSES, "policy loss")(name)


def get_policy_loss(name: str) -> Callable:
    if name not in POLICY_LOSSES:
        raise ValueError(f"unknown objective {name!r}; choose one of {tuple(POLICY_LOSSES)}")
    fn = POLICY_LOSSES[name]
    return resolve(fn) if isinstance(fn, str) else fn
