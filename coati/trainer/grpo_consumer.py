"""GRPO, DAPO and PG: one consumer parameterised by ``config.algo`` (the -a preset plus --grpo-config).

Per step, on the groups drawn from the buffer:
1. ``select_groups``: with ``filter_range``, groups whose accuracy (mean of ``correct``) lies outside it are
   dropped (DAPO's dynamic sampling; the base consumer keeps drawing when dynamic batching is on).
2. ``build_batches``: rewards are shaped (soft overlong punishment added to the raw reward), advantages are
   recomputed from them per group (``group_norm``: (r - mean) / (std + eps); ``group_mean``: r - mean), and a
   per-sample loss mask drops truncated responses (filter_truncated_response) and keeps the top-k samples
   per group (--topk-samples). The producer's advantages (plain GRPO on raw rewards) are not used: the
   algorithm lives here, the producer only generates and scores. Raw rewards and accuracy stay in the
   groups, so rollout metrics report them unshaped. The loss normaliser covers the whole step's batch;
   reference logprobs (beta > 0) are computed here, once per rollout batch, and reused by every ppo epoch.
3. ``loss_fn``: the policy loss of loss.py (clip-higher, token/sample-level, skip_threshold, k3 KL, the
   off-policy correction) and the mean token entropy of the policy, taken from the logits the loss already has.
   Proximal logprobs (the trainer's policy at the start of the step, for the decoupled correction and the
   mismatch metrics) cost no extra forward pass: within the first ppo epoch no optimizer step has happened
   yet, so the loss's own logprobs, detached, are exactly those; with several epochs they are kept per
   micro-batch (in call order, which every epoch repeats) and reused by the later epochs.
"""

from __future__ import annotations

import torch

from coati.algorithm.loss import MAX_STATS, aggregate, normaliser_from_counts, policy_loss, token_entropy
from coati.algorithm.pipeline import GroupStages, GroupTensors
from coati.rollout.group import RolloutGroup, collate, split_micro_batches, token_logprobs
from coati.trainer.consumer import Consumer


def group_tensors(groups: list[RolloutGroup]) -> GroupTensors:
    """The [groups, G] tensors the algorithm's stages read (coati.algorithm.pipeline)."""
    return GroupTensors(
        rewards=torch.tensor([g.rewards for g in groups], dtype=torch.float32),
        lengths=torch.tensor([g.model_token_counts() for g in groups], dtype=torch.float32),  # tool output excluded
        truncated=torch.tensor([[reason == "length" for reason in g.finish_reasons] for g in groups]),
        correct=torch.tensor([g.correct for g in groups], dtype=torch.float32))


def shaped_group_tensors(groups: list[RolloutGroup], groups_config, max_new_tokens: int):
    """(shaped rewards [n, G], advantages [n, G], sample loss mask [n, G]) for a list of groups (pure)."""
    return GroupStages.from_config(groups_config).run(group_tensors(groups), groups_config, max_new_tokens)


def load_reference(config) -> torch.nn.Module:
    """The frozen initial policy of the KL term, on the device and in the dtype the device rule gives it."""
    from transformers import AutoModelForCausalLM

    placement = config.parallel.model_placement("reference")
    model = AutoModelForCausalLM.from_pretrained(config.model.path, dtype=placement.dtype).to(placement.device)
    return model.eval().requires_grad_(False)


class GRPOConsumer(Consumer):
    summed_stats = ("skipped_samples",)
    max_stats = MAX_STATS

    def length_limit(self) -> int:
        """L_max of the soft overlong punishment: the model's tokens per response (per episode with --env)."""
        episodes = self.config.episodes
        return self.config.sampling.max_new_tokens if episodes.env is None else episodes.max_episode_tokens

    def setup_algorithm(self) -> None:
        self.loss_config = self.config.algo.loss
        self.groups_config = self.config.algo.groups
        self.temperature = self.config.sampling.temperature
        self._prox: list[torch.Tensor] = []  # first-epoch logprobs per micro-batch, for later ppo epochs
        self._prox_epoch, self._prox_at = 0, 0
        self.reference = None
        if self.loss_config.kl_loss_coef > 0:
            self.reference = load_reference(self.config)

    @torch.no_grad()
    def _reference_logprobs(self, batch: dict) -> torch.Tensor:
        chunks = []
        device = next(self.reference.parameters()).device
        for micro in split_micro_batches(batch, self.config.batch.train_microbatch_size):
            input_ids = micro["input_ids"].to(device)
            logits = self.reference(input_ids=input_ids, attention_mask=micro["attention_mask"].to(device)).logits
            chunks.append(token_logprobs(logits, input_ids, self.temperature).to(micro["input_ids"].device))
        return torch.cat(chunks)

    def select_groups(self, groups):
        filter_range = self.groups_config.filter_range
        if filter_range is None:
            return groups, {"groups_filtered": 0}
        data = group_tensors(groups)
        keep = GroupStages.from_config(self.groups_config).keep_groups(data, self.groups_config).tolist()
        kept = [g for g, k in zip(groups, keep) if k]
        accuracy = data.correct.mean(dim=1)
        return kept, {"groups_filtered": len(groups) - len(kept),
                      "groups_filtered_high": int((accuracy > filter_range[1]).sum()),  # e.g. all correct
                      "groups_filtered_low": int((accuracy < filter_range[0]).sum())}  # e.g. all wrong

    def build_batches(self, share, kept, padding):
        size = self.config.batch.train_minibatch_size
        mnt = self.length_limit()
        rewards, advantages, sample_mask = shaped_group_tensors(share, self.groups_config, mnt)
        if padding:  # placeholders that only keep the ranks' collective calls in step
            sample_mask[len(share) - padding :] = 0
        # One normaliser for the whole step, over every data-parallel rank's groups: the loss is the mean over
        # every valid token / sample of the step. Each rank divides by it / dp, since gradients are averaged.
        all_rewards, _, all_mask = (rewards, advantages, sample_mask) if self.plugin.dp_size == 1 else \
            shaped_group_tensors(kept, self.groups_config, mnt)
        lengths = torch.tensor([g.model_token_counts() for g in kept], dtype=torch.float32)
        normaliser = normaliser_from_counts((lengths * all_mask).reshape(-1), self.loss_config.loss_variation)
        normaliser /= self.plugin.dp_size
        batches = []
        for start in range(0, len(share), size):
            batch = collate(share[start : start + size], self.pad_id)
            batch["advantages"] = advantages[start : start + size].reshape(-1)
            batch["sample_mask"] = sample_mask[start : start + size].reshape(-1)
            batch["action_mask"] = batch["action_mask"] * batch["sample_mask"].unsqueeze(1)
            batch["normaliser"] = torch.full((batch["input_ids"].shape[0],), normaliser)
            if self.reference is not None:
                batch["ref_logprobs"] = self._reference_logprobs(batch)
            batches.append(batch)
        self._step_stats = {
            "shaped_reward": float(all_rewards.mean()),
            "samples_masked": float((all_mask == 0).sum()),
            "samples_in_loss": float(all_mask.sum()),
        }
        return batches

    def rollout_tensors(self, kept):
        return shaped_group_tensors(kept, self.groups_config, self.length_limit())

    def step(self):
        self._step_stats = {}
        self._prox, self._prox_epoch, self._prox_at = [], 0, 0
        metrics = super().step()
        if metrics is not None:
            metrics.update(self._step_stats)
        return metrics

    def _proximal(self, logprobs: torch.Tensor) -> torch.Tensor:
        """The policy's logprobs at the start of the step for this micro-batch (see the module docstring)."""
        if self.epoch == 0:
            prox = logprobs.detach()
            if self.config.algo.ppo_epochs > 1:
                self._prox.append(prox)
            return prox
        if self.epoch != self._prox_epoch:
            self._prox_epoch, self._prox_at = self.epoch, 0
        prox = self._prox[self._prox_at]
        self._prox_at += 1
        return prox

    def loss_fn(self, logits, micro_batch):
        logprobs = token_logprobs(logits, micro_batch["input_ids"], self.temperature)
        normaliser = float(micro_batch["normaliser"][0])
        loss, stats = policy_loss(logprobs, micro_batch["old_logprobs"], micro_batch["advantages"],
                                  micro_batch["action_mask"], self.loss_config, normaliser,
                                  micro_batch.get("ref_logprobs"), prox_logprobs=self._proximal(logprobs))
        entropy = token_entropy(logits, self.temperature)
        stats["entropy"] = aggregate(entropy, micro_batch["action_mask"], self.loss_config.loss_variation, normaliser)
        return loss, stats
