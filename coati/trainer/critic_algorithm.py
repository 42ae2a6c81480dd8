"""RLHF-PPO with a critic (``-a PPO``): the policy and a value model (the ``critic`` role) trained side by side on
the same ranks.

Per step, on the groups drawn (every group is trained on: no filter; G may be 1):
1. ``build_batches``, once per rollout batch: the frozen reference (the initial, SFT policy) gives its token
   logprobs; the critic, before its update, gives per-token values (``forward_only``); each response's score is
   the reward model's (computed by the producers, ``RolloutGroup.scores``) plus ``verifiable_reward_weight``
   times the ``-rt`` reward, clamped to ``score_clip``. Per-token rewards are -beta * (logp_behaviour -
   logp_ref) on every response token plus the score on the last one (advantage.kl_penalised_rewards); GAE
   turns them and the values into advantages and returns (the critic's targets). Advantages are whitened over
   every response token of the step, on all data-parallel ranks together (one all-reduce of the sums), so
   any layout trains on exactly the advantages of one process. With round-level minibatches (round_batches.py)
   a step's batch is its random part of the round's responses, valued by the critic as it is at that step.
2. Every ppo epoch, each minibatch trains both roles: the policy with the clipped surrogate (loss.py
   ``ppo_clip``, token-level; objective.py's policy loss, with per-token advantages) and the critic with the
   clipped value loss 0.5 * max((V - R)^2, (V_clip - R)^2) (loss.value_loss), each through its own plugin and
   optimizer.
3. After the step the KL controller sees the step's mean KL per response (summed over its tokens, as TRL and
   OpenRLHF feed it) and, with ``--kl-target``, moves beta (kl_control.py). Beta is in the checkpoint.

Metrics: rm_score (mean reward-model score of the rollouts), score (what entered the rewards), kl (per token)
and kl_seq (per response) to the reference, kl_coef, value_loss, value_clip_fraction, explained_variance
(1 - Var(R - V) / Var(R) over response tokens, before the critic's update), values_mean, returns_mean,
critic_grad_norm, and the policy's statistics as for GRPO.
"""

from __future__ import annotations

import torch

from coati.algorithm.advantage import get_adv_estimator, kl_penalised_rewards
from coati.algorithm.batch import collate, split_micro_batches
from coati.algorithm.kl_control import KLController
from coati.algorithm.loss import MAX_STATS, kl_k1, normaliser_from_counts, value_loss
from coati.rollout.group import RolloutGroup
from coati.trainer.group_algorithm import filter_groups
from coati.trainer.objective import PolicyObjective, load_reference
from coati.trainer.step_algorithm import StepAlgorithm

CRITIC = "critic"
VALUE_HEAD = ("score",)  # the token-classification head of the Llama-family critics load_critic builds: with
                         # LoRA it trains in full beside the adapters (a fresh head has no base to adapt)
# Sums over the step's response tokens / responses, all-reduced once over the ranks (in build_batches).
_SUMS = ("tokens", "adv", "adv_sq", "ret", "ret_sq", "err", "err_sq", "kl", "responses", "rm_score",
         "score", "values")


def load_critic(path: str, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """A token-classification model with one label at ``path``: an LM body and a scalar value at every position.

    From a reward model (``...ForSequenceClassification``) the score head carries over exactly (both are a
    bias-free linear map of the hidden state); from a causal LM the head is fresh. No dropout: the values of
    the same tokens must be the same on every rank and every pass.
    """
    from transformers import AutoConfig, AutoModelForTokenClassification
    from transformers.utils import logging as hf_logging

    config = AutoConfig.from_pretrained(path, num_labels=1)
    config.classifier_dropout, config.token_classification_bias = 0.0, False
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # "score.weight newly initialized" when starting from a causal LM: expected
    try:
        model = AutoModelForTokenClassification.from_pretrained(path, config=config, dtype=dtype)
    finally:
        hf_logging.set_verbosity(verbosity)
    model.config.architectures = [type(model).__name__]
    return model


def critic_values(logits: torch.Tensor) -> torch.Tensor:
    """[B, L-1] values of the states before each next token, aligned with ``token_logprobs``/``action_mask``."""
    return logits[:, :-1, 0].float()


def group_scores(groups: list[RolloutGroup], verifiable_weight: float) -> torch.Tensor:
    """[samples] each response's score before clamping: reward-model score + weight * verifiable reward."""
    scores = []
    for group in groups:
        model_scores = group.scores or [0.0] * len(group.responses)
        scores += [s + verifiable_weight * r for s, r in zip(model_scores, group.rewards)]
    return torch.tensor(scores, dtype=torch.float32)


class CriticAlgorithm(StepAlgorithm):
    summed_stats = ("skipped_samples",)
    max_stats = MAX_STATS

    def __init__(self, context):
        config, ppo = context.config, context.config.algo.ppo
        super().__init__(context, PolicyObjective(config, load_reference(config, context.policy_plugin)))  # the KL is in the reward
        self.ppo = ppo
        self.estimator = get_adv_estimator(config.algo.groups.advantage).fn
        self.kl_ctl = KLController(ppo.kl_reward_coef, ppo.kl_target, ppo.kl_horizon)
        torch.manual_seed(config.run.seed)  # a fresh value head starts identical on every rank
        critic = load_critic(ppo.critic_model or ppo.reward_model or config.model.path,
                             config.parallel.model_placement("critic").dtype)
        torch.manual_seed(config.run.seed + context.rank)
        self.critic = context.add_role(CRITIC, critic, ppo.critic_learning_rate or config.algo.learning_rate,
                                       self.critic_loss, trained_modules=VALUE_HEAD)

    def select_groups(self, groups):
        return filter_groups(groups, self.config.algo.groups)

    # --- the rollout batch: rewards, values, GAE ---
    @torch.no_grad()
    def _values(self, batch: dict) -> torch.Tensor:
        micro = split_micro_batches(batch, self.config.batch.train_microbatch_size)
        return torch.cat(self.critic.plugin.forward_only(micro, lambda logits, _: critic_values(logits).cpu()))

    def build_batches(self, share, kept, padding, rows=None):
        size = self.minibatch_units(rows)  # values and GAE are per response: sample views need nothing of the round
        ppo, beta = self.ppo, self.kl_ctl.value
        lengths = torch.tensor([n for g in kept for n in g.model_token_counts()], dtype=torch.float32)
        normaliser = normaliser_from_counts(lengths, "token_level") / self.context.dp_size
        first_padded = len(share) - padding
        batches, sums = [], dict.fromkeys(_SUMS, 0.0)
        for start in range(0, len(share), size):
            groups = share[start : start + size]
            batch = collate(groups, self.context.pad_id)
            real = torch.tensor([start + i < first_padded for i, g in enumerate(groups) for _ in g.responses])
            mask = batch["action_mask"] * real.unsqueeze(1)  # placeholders only keep the collectives in step
            batch["action_mask"] = mask
            batch["ref_logprobs"] = self.objective.reference.logprobs(batch)
            values = self._values(batch) * mask
            raw = group_scores(groups, ppo.verifiable_reward_weight)
            scores = raw if ppo.score_clip is None else raw.clamp(-ppo.score_clip, ppo.score_clip)
            kl = kl_k1(batch["old_logprobs"], batch["ref_logprobs"]) * mask
            rewards = kl_penalised_rewards(kl, mask, scores, beta)
            advantages, returns = self.estimator(rewards, values, mask, gamma=ppo.gamma, lam=ppo.lam)
            batch.update(advantages=advantages, returns=returns, old_values=values,
                         sample_mask=real.float(), normaliser=torch.full((len(real),), normaliser))
            batches.append(batch)
            model_scores = group_scores(groups, 0.0)  # the reward model's alone
            error = (returns - values) * mask
            for name, value in (("tokens", mask.sum()), ("adv", advantages.sum()), ("adv_sq", (advantages ** 2).sum()),
                                ("ret", returns.sum()), ("ret_sq", (returns ** 2).sum()), ("err", error.sum()),
                                ("err_sq", (error ** 2).sum()), ("kl", kl.sum()), ("responses", real.sum()),
                                ("rm_score", (model_scores * real).sum()),
                                ("score", (scores * real).sum()), ("values", values.sum())):
                sums[name] += float(value)
        # over every data-parallel rank's share; float64 keeps the whitening exact enough to match one process
        sums = self.context.reduce(sums, summed=_SUMS)
        if ppo.whiten_advantages:
            mean = sums["adv"] / max(sums["tokens"], 1.0)
            var = (sums["adv_sq"] - sums["tokens"] * mean ** 2) / max(sums["tokens"] - 1.0, 1.0)
            for batch in batches:
                batch["advantages"] = (batch["advantages"] - mean) * torch.rsqrt(torch.tensor(var + 1e-8)) \
                    * batch["action_mask"]
        self.step_stats = self._batch_metrics(sums, beta)
        return batches

    @staticmethod
    def _batch_metrics(sums: dict[str, float], beta: float) -> dict[str, float]:
        tokens, responses = max(sums["tokens"], 1.0), max(sums["responses"], 1.0)
        ret_var = sums["ret_sq"] / tokens - (sums["ret"] / tokens) ** 2
        err_var = sums["err_sq"] / tokens - (sums["err"] / tokens) ** 2
        return {"rm_score": sums["rm_score"] / responses, "score": sums["score"] / responses,
                "kl": sums["kl"] / tokens, "kl_seq": sums["kl"] / responses, "kl_coef": beta,
                "values_mean": sums["values"] / tokens, "returns_mean": sums["ret"] / tokens,
                "explained_variance": 1.0 - err_var / ret_var if ret_var > 1e-12 else 0.0,
                "samples_in_loss": sums["responses"]}

    def rollout_tensors(self, kept):
        """For the rollout logs: each response's score as the rewards saw it, no per-sample advantage (PPO's are
        per token; 0 here), every sample in the loss."""
        scores = group_scores(kept, self.ppo.verifiable_reward_weight).reshape(len(kept), -1)
        return scores, torch.zeros_like(scores), torch.ones_like(scores)

    # --- the critic ---
    def critic_loss(self, logits, micro_batch):
        loss, stats = value_loss(critic_values(logits), micro_batch["old_values"], micro_batch["returns"],
                                 micro_batch["action_mask"], self.ppo.value_loss, self.ppo.value_clip,
                                 float(micro_batch["normaliser"][0]), "token_level")
        return loss, stats

    def finish_step(self, metrics: dict) -> None:
        super().finish_step(metrics)
        if "kl_seq" in metrics:
            self.kl_ctl.update(metrics["kl_seq"], int(metrics["samples_in_loss"]))

    def state(self) -> dict:
        return {"kl_coef": self.kl_ctl.value}

    def load_state(self, state: dict) -> None:
        if "kl_coef" in state:
            self.kl_ctl.value = state["kl_coef"]
