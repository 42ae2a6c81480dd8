"""Options of RLHF-PPO with a critic (``-a PPO``): the reward model, the critic, GAE and the KL-in-reward penalty.

One dataclass whose fields are also the flags (their metadata: coati/utils/dataclass_cli.py); every one but
--reward-model (which also scores the rollouts and evaluations of the other algorithms) belongs to the critic's
estimators (``family``), so another -a refuses it when set. Defaults, and
the anchors' values they were chosen against (TRL's PPOTrainer, OpenRLHF's train_ppo, verl's ppo_trainer):

| option | here | TRL | OpenRLHF | verl |
|---|---|---|---|---|
| gamma | 1.0 | 1.0 | 1.0 | 1.0 |
| lam | 0.95 | 0.95 | 0.95 | 1.0 |
| value_clip | 0.2 | 0.2 | 0.2 | 0.5 |
| kl_reward_coef (KL in the reward, k1) | 0.05 | 0.05 | 0.01 | 0.001 |
| kl_target / kl_horizon | off / 10000 | off / 10000 | off / 10000 | off / 10000 |
| score_clip | 10 | none | 10 | none |
| whiten_advantages | on | on | on | on |
| critic init | reward model | reward model | reward model | the policy |

The critic is a token-classification model with one label (``AutoModelForTokenClassification``): the LM body
and a scalar head at every position. Initialised from the reward model by default (its body and score head
carry over, OpenRLHF's choice: the critic starts out predicting the score the episode will get), or from any
HF directory (``--critic-model``: e.g. the SFT model, with a fresh head).
"""

from __future__ import annotations

from dataclasses import dataclass

from coati.utils.dataclass_cli import option

VALUE_LOSS_NAMES = ("clipped", "mse")


@dataclass(frozen=True)
class PPOConfig:
    family = "critic"  # the algorithms whose fields these are, unless a field's option says otherwise

    reward_model: str | None = option(
        None, "-a PPO: reward model directory (`coati rm` output, AutoModelForSequenceClassification with one label); "
              "the inferencers score every response with it", "-rm", family=None)
    critic_model: str | None = option(
        None, "-a PPO: the critic's starting weights (default: the reward model, else the policy with a fresh head)")
    critic_learning_rate: float | None = option(
        None, "-a PPO: the critic's AdamW learning rate (default: the policy's -lr)")
    gamma: float = option(1.0, "-a PPO: discount of GAE over response tokens")
    lam: float = option(0.95, "-a PPO: GAE lambda")
    value_clip: float = option(0.2, "-a PPO: the critic's values move at most this far from the rollout's values per "
                                    "batch (clipped value loss)")
    value_loss: str = option("clipped", "-a PPO: the critic's loss: clipped 0.5*max((V-R)^2, (V_clip-R)^2) or mse",
                             choices=VALUE_LOSS_NAMES)
    kl_reward_coef: float = option(
        0.05, "-a PPO: beta of the per-token KL penalty to the initial (SFT) policy in the reward, -beta*(logp - "
              "ref_logp); the starting value with --kl-target", "--kl-coef", metavar="COEF", instead="--kl-loss-coef (the KL term "
              "in the loss)")
    kl_target: float | None = option(None, "-a PPO: adaptive KL controller: move beta towards this KL per sample "
                                           "(default: beta fixed)")
    kl_horizon: int = option(10000, "-a PPO: adaptive KL controller horizon (samples)")
    score_clip: float | None = option(10.0, "-a PPO: the sequence score is clamped to [-clip, clip] (null: no clamp)")
    whiten_advantages: bool = option(True, "-a PPO: whiten advantages over the step's response tokens")
    verifiable_reward_weight: float = option(
        0.0, "-a PPO: add this times the -rt verifiable reward to the reward model's score (0: the reward model alone; "
             "without --reward-model the verifiable reward alone must carry the score)")

    @property
    def uses_reward_model(self) -> bool:
        return self.reward_model is not None
