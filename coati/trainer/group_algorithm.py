"""Group-relative algorithms (GRPO, DAPO, PG, RLOO, ...): advantages from each group's rewards, no critic.

Per step, on the groups drawn from the buffer:
1. ``select_groups``: with ``filter_range``, groups whose accuracy (mean of ``correct``) lies outside it are
   dropped (DAPO's dynamic sampling; the rollout feed keeps drawing when dynamic batching is on).
2. ``build_batches``: the stages of coati.algorithm.pipeline shape the rewards (soft overlong punishment),
   compute advantages per group with the named estimator and mask samples (truncated responses, top-k per
   group). Producers ship raw rewards only; raw rewards and accuracy stay in the groups, so rollout metrics
   report them unshaped. With round-level minibatches (round_batches.py) these stages run once per round, over
   its whole groups (``round_tensors``), and each step indexes its samples; without, they run over the whole
   step's groups and each rank takes its share's rows. The loss normaliser covers the whole step's batch
   (Dr.GRPO's constant one: its samples x L_max); reference logprobs (KL in the loss)
   are computed here, once per rollout batch, and reused by every ppo epoch.
3. The policy loss of objective.py.
"""

from __future__ import annotations

import torch

from coati.algorithm.batch import collate
from coati.algorithm.idle_rows import check_idle_rows
from coati.algorithm.loss import MAX_STATS, normaliser_from_counts
from coati.algorithm.pipeline import GroupStages, GroupTensors
from coati.rollout.group import RolloutGroup
from coati.trainer.objective import PolicyObjective, load_reference
from coati.trainer.step_algorithm import StepAlgorithm
from coati.trainer.step_data import share_bounds


def group_tensors(groups: list[RolloutGroup]) -> GroupTensors:
    """The [groups, G] tensors the algorithm's stages read (coati.algorithm.pipeline)."""
    return GroupTensors(
        rewards=torch.tensor([g.rewards for g in groups], dtype=torch.float32),
        lengths=torch.tensor([g.model_token_counts() for g in groups], dtype=torch.float32),  # tool output excluded
        truncated=torch.tensor([[reason == "length" for reason in g.finish_reasons] for g in groups]),
        # a sample without a verdict counts as not correct (preflight refuses filter_range when none is defined)
        correct=torch.tensor([[bool(c) for c in g.correct] for g in groups], dtype=torch.float32))


def shaped_group_tensors(groups: list[RolloutGroup], groups_config, max_new_tokens: int):
    """(shaped rewards [n, G], advantages [n, G], sample loss mask [n, G]) for a list of groups (pure)."""
    return GroupStages.from_config(groups_config).run(group_tensors(groups), groups_config, max_new_tokens)


def filter_groups(groups: list[RolloutGroup], groups_config) -> tuple[list[RolloutGroup], dict]:
    """The groups every group filter the config turns on keeps, and how many fell on either side of
    ``filter_range`` when it is set."""
    filter_range, stages = groups_config.filter_range, GroupStages.from_config(groups_config)
    if not stages.filters:
        return groups, {"groups_filtered": 0}
    data = group_tensors(groups)
    keep = stages.keep_groups(data, groups_config).tolist()
    kept = [g for g, k in zip(groups, keep) if k]
    if filter_range is None:  # a user's own filters only
        return kept, {"groups_filtered": len(groups) - len(kept)}
    accuracy = data.correct.mean(dim=1)
    return kept, {"groups_filtered": len(groups) - len(kept),
                  "groups_filtered_high": int((accuracy > filter_range[1]).sum()),  # e.g. all correct
                  "groups_filtered_low": int((accuracy < filter_range[0]).sum())}  # e.g. all wrong


def length_limit(config) -> int:
    """L_max of the soft overlong punishment: the model's tokens per response (per episode with --env)."""
    episodes = config.episodes
    return config.sampling.max_new_tokens if episodes.env is None else episodes.max_episode_tokens


class GroupAlgorithm(StepAlgorithm):
    summed_stats = ("skipped_samples",)
    max_stats = MAX_STATS

    def __init__(self, context):
        config = context.config
        reference = load_reference(config, context.policy_plugin) if config.algo.loss.kl_loss_coef > 0 else None
        super().__init__(context, PolicyObjective(config, reference))
        self.groups_config = config.algo.groups
        if self.groups_config.skip_idle_samples:
            idle = check_idle_rows(self.objective.policy_loss, config.algo.loss)
            self.skip_idle, self.unchanged_stats = idle.inert, idle.unchanged_stats

    def select_groups(self, groups):
        return filter_groups(groups, self.groups_config)

    def round_tensors(self, groups):
        rewards, advantages, sample_mask = shaped_group_tensors(groups, self.groups_config, length_limit(self.config))
        lengths = torch.tensor([g.model_token_counts() for g in groups], dtype=torch.float32)
        return {"rewards": rewards.reshape(-1), "advantages": advantages.reshape(-1),
                "sample_mask": sample_mask.reshape(-1), "lengths": lengths.reshape(-1)}

    def build_batches(self, share, kept, padding, rows=None):
        size, dp = self.minibatch_units(rows), self.context.dp_size
        per_unit = len(share[0].responses)
        if rows is None:  # whole groups: shaped here over every group of the step (an estimator may normalise over
            # the batch, REINFORCE++), of which this rank takes its share's rows (rollout_feed.dp_share)
            every = self.round_tensors(kept)
            start, end = share_bounds(len(kept), dp, self.context.dp_rank)
            own_rows = torch.cat([torch.arange(start * per_unit, end * per_unit),
                                  torch.arange(per_unit).repeat(padding)])  # placeholders: copies of kept[0]
            own = {name: values[own_rows] for name, values in every.items()}
        else:  # sample views of a round: shaped over the round's whole groups when it was drawn
            own = {name: values[rows.share] for name, values in rows.tensors.items()}
            every = {name: values[rows.kept] for name, values in rows.tensors.items()}
        advantages, sample_mask = own["advantages"], own["sample_mask"].clone()
        if padding:  # placeholders that only keep the ranks' collective calls in step
            sample_mask[(len(share) - padding) * per_unit :] = 0
        # One normaliser for the whole step, over every data-parallel rank's samples: the loss is the mean over
        # every valid token / sample of the step. Each rank divides by it / dp, since gradients are averaged.
        all_mask = every["sample_mask"]
        variation, limit = self.config.algo.loss.loss_variation, length_limit(self.config)
        normaliser = normaliser_from_counts(every["lengths"] * all_mask, variation, limit)
        zero = (every["advantages"] == 0) & (all_mask > 0)  # in the loss, no gradient
        idle, every_idle = self.idle_samples(own["advantages"], sample_mask, zero, all_mask)
        if every_idle.any():
            # Left out of the loss (their action masks zeroed) and so out of the forward (Layout.split): the
            # gradient is the same; the statistics they would have added to become means over the samples trained.
            sample_mask = sample_mask * (~idle).to(sample_mask.dtype)
            self.stats_scale = normaliser / normaliser_from_counts(every["lengths"] * all_mask * ~every_idle,
                                                                   variation, limit)
        else:
            self.stats_scale = 1.0
        normaliser /= dp
        batches = []
        for start in range(0, len(share), size):
            rows_slice = slice(start * per_unit, (start + size) * per_unit)
            batch = collate(share[start : start + size], self.context.pad_id)
            batch["advantages"] = advantages[rows_slice]
            batch["sample_mask"] = sample_mask[rows_slice]
            batch["action_mask"] = batch["action_mask"] * batch["sample_mask"].unsqueeze(1)
            batch["normaliser"] = torch.full((batch["input_ids"].shape[0],), normaliser)
            if self.objective.reference is not None:
                batch["ref_logprobs"] = self.objective.reference.logprobs(batch)
            batches.append(batch)
        self.step_stats = {
            "shaped_reward": float(every["rewards"].mean()),
            "samples_masked": float((all_mask == 0).sum()),
            "samples_in_loss": float(all_mask.sum()),
            "samples_zero_advantage": float(zero.sum()),
        }
        return batches

    def idle_samples(self, advantages: torch.Tensor, sample_mask: torch.Tensor, zero: torch.Tensor,
                     all_mask: torch.Tensor):
        """(this rank's rows, the step's samples) the loss gives no gradient that the step leaves out, as bool
        masks: samples in the loss with advantage 0 (``zero``: the step's, whose loss mask is ``all_mask``). All
        false where skipping is off, the loss was not found inert, or no sample of the step would train (a step
        always trains, so every optimizer step sees gradients)."""
        own = (advantages == 0) & (sample_mask > 0)
        if not self.skip_idle or not ((all_mask > 0) & ~zero).any():
            return torch.zeros_like(own), torch.zeros_like(zero)
        return own, zero

    def rollout_tensors(self, kept):
        return shaped_group_tensors(kept, self.groups_config, length_limit(self.config))
