"""What the trainer optimises: the -a presets, the policy loss and group shaping knobs, PPO's critic options.

A preset is a row of changes to the fields' defaults, in --grpo-config keys (coati/config/grpo_config.py makes
the keys from the fields). A new algorithm adds a row here and registers its functions
(rows of coati/algorithm/registry.py); a new knob is one field of PolicyLossConfig,
GroupConfig, OptimConfig (optim.py) or AlgoConfig (``grpo_key=True``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from coati.algorithm.loss_config import PolicyLossConfig
from coati.algorithm.registry import get_adv_estimator
from coati.config.optim import OptimConfig
from coati.config.ppo import PPOConfig
from coati.utils.dataclass_cli import option, setting

# What each -a preset changes from the defaults (the defaults of PolicyLossConfig, GroupConfig and AlgoConfig,
# with kl_loss_coef = -kl and cache_length = min(1024, -mnt // 4)), in --grpo-config keys.
ALGO_PRESETS: dict[str, dict] = {
    "GRPO": {},
    "DAPO": {"filter_range": (0.01, 0.99), "dynamic_batching": True, "clip_eps_high": 0.28, "skip_threshold": 20.0,
             "kl_loss_coef": 0.0, "loss_variation": "token_level", "soft_over_length_punishment": True,
             "filter_truncated_response": True},
    "PG": {"objective": "reinforce", "advantage": "group_mean"},
    # Zheng et al. 2025: the sequence-level ratio, clipped in the paper's narrow band, mean per sample
    "GSPO": {"objective": "gspo", "clip_eps_low": 3e-4, "clip_eps_high": 4e-4},
    # MiniMax-M1: REINFORCE weighted by min(ratio, 5), stop-gradient (no lower bound), token-level (TRL's default)
    "CISPO": {"objective": "cispo", "clip_eps_low": 1.0, "clip_eps_high": 4.0, "loss_variation": "token_level"},
    # Liu et al. 2025: no std in the advantage, no length in the normaliser (samples x L_max)
    "DrGRPO": {"advantage": "group_mean", "loss_variation": "sample_sum_norm"},
    # RLHF-PPO: per-token GAE advantages from a critic, the reward model's score and a KL penalty in the reward
    # (the KL lives in the reward, so the loss's kl_loss_coef stays 0); options in ppo.PPOConfig.
    "PPO": {"advantage": "gae", "loss_variation": "token_level"},
}
ALGOS = tuple(ALGO_PRESETS)


def _preset_text(name: str) -> str:
    changes = ALGO_PRESETS[name]
    return f"{name}: " + (", ".join(f"{key} {json.dumps(value)}" for key, value in changes.items())
                          if changes else "the defaults")


ALGO_HELP = (
    "algorithm preset, as changes to the defaults (clip_eps 0.2/0.2, sample_level loss, ppo_clip objective, "
    "group_norm advantage, kl_loss_coef = -kl, cache_length = min(1024, mnt // 4)). "
    + "; ".join(_preset_text(name) for name in ALGOS)
    + ". GRPO: group-normalised advantages; DAPO: dynamic sampling, clip-higher, token-level loss, overlong "
    "shaping; PG: REINFORCE with a group-mean baseline (no ratio or clip); GSPO: sequence-level importance ratio "
    "and clip; CISPO: REINFORCE weighted by the clipped, stop-gradient ratio; DrGRPO: group-mean advantages, "
    "loss summed over tokens / (samples x max length); PPO: RLHF-PPO with a critic, per-token "
    "GAE advantages from the reward model's score (--reward-model) and a KL penalty to the initial policy in the "
    "reward (--kl-reward-coef). Every field can be changed with --grpo-config"
)


def estimator_family(advantage: str) -> str:
    """'critic' for an estimator reading a critic's per-token values (PPO), else 'group' (GRPO, DAPO, PG)."""
    return "critic" if get_adv_estimator(advantage).inputs == "token_values" else "group"


def presets_of(family: str) -> tuple[str, ...]:
    """The -a presets whose estimator is of ``family``."""
    return tuple(name for name in ALGOS
                 if estimator_family(ALGO_PRESETS[name].get("advantage", GroupConfig.advantage)) == family)


@dataclass(frozen=True)
class GroupConfig:
    """What happens to rollout groups between the buffer and the loss (the non-loss --grpo-config keys)."""

    advantage: str = setting("group_norm", "the advantage estimator, by registered name")
    filter_range: tuple[float, float] | None = setting(
        None, "[low, high]: keep groups whose accuracy lies in it (DAPO's dynamic sampling); null: all")
    dynamic_batching: bool = setting(False, "keep drawing groups until a full -tbs batch survives the filter")
    max_draw_multiple: int = setting(4, "dynamic batching draws at most this many times -tbs groups per step")
    soft_over_length_punishment: bool = setting(False, "DAPO eq. 13, added to the reward before advantages")
    cache_length: int = setting(0, "the soft over-length zone, in tokens before -mnt")
    filter_truncated_response: bool = setting(False, "responses that hit -mnt leave the loss")
    skip_idle_samples: bool = setting(
        True, "samples the loss gives no gradient (advantage 0, as in a group whose samples all scored alike, or "
              "outside the loss) skip the forward and backward, where the loss is checked to give them exactly 0; "
              "the entropy and the off-policy statistics then average over the trained samples. false: run them")
    topk_samples: int | None = option(None, "keep only the K highest-reward samples of each group in the loss "
                                            "(ties: lower index; default: all)", family="group")
    # a user's own group stages (@register_reward_shaper / _sample_mask / _group_filter), after the preset's
    reward_shapers: tuple[str, ...] = setting((), "more reward shapers, by registered name, after the preset's")
    sample_masks: tuple[str, ...] = setting((), "more sample masks, by registered name, ANDed into the loss mask")
    group_filters: tuple[str, ...] = setting((), "more group filters, by registered name, at draw time")


@dataclass(frozen=True)
class AlgoConfig:
    name: str = option("GRPO", ALGO_HELP, "-a", flag="--algo", choices=ALGOS)
    learning_rate: float = option(3e-4, "AdamW learning rate; default: 3e-4 for the demo, else 1e-6", "-lr",
                                  resolved=True)
    max_grad_norm: float = option(1.0, "gradient clipping (0: off)")
    loss: PolicyLossConfig = PolicyLossConfig()
    groups: GroupConfig = GroupConfig()
    optim: OptimConfig = OptimConfig()  # schedule, weight decay, gradient checkpointing, max steps
    ppo_epochs: int = option(1, "optimizer passes over every rollout batch (default 1; 4 for the code demo)",
                             resolved=True, grpo_key=True)
    learner_chunk_size: int = option(
        0, "learner-side generation: the weight-sending trainer also generates N prompts (x G samples) per round "
           "with the just-published weights while it would otherwise wait for the producers; a round then holds "
           "num_inferencer*ibs + N groups, which must be a multiple of dp*tbs (default 0: off)", resolved=True,
        grpo_key=True)
    ppo: PPOConfig = PPOConfig()  # the critic, reward model and KL-in-reward of token-value estimators (PPO)

    @property
    def uses_critic(self) -> bool:
        """Whether the advantage estimator reads a critic's per-token values (PPO) rather than group rewards."""
        return estimator_family(self.groups.advantage) == "critic"
