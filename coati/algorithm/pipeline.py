"""The group algorithms (GRPO, DAPO, PG, RLOO, ...) as a pipeline of registered pure stages, chosen by name:

    shape rewards -> advantages -> sample masks -> policy loss

1. Reward shapers (``@register_reward_shaper``) turn the producers' raw rewards [groups, G] into the rewards
   the advantages see (DAPO's ``overlong`` punishment).
2. The advantage estimator (advantage.py's registry, ``--grpo-config advantage``) turns shaped rewards into
   per-sample advantages, always over the whole group (REINFORCE++'s, over the whole batch: every group the
   step, or with round-level minibatches the round, trains on).
3. Sample masks (``@register_sample_mask``) say which samples enter the loss (``truncated``: drop responses
   that hit max_new_tokens; ``topk``: the k best of each group); their AND is the loss mask.
4. The policy loss (loss.py's registry, ``objective``) runs per micro-batch in the trainer.
Group filters (``@register_group_filter``: DAPO's ``accuracy_range``) decide earlier, at draw time, which whole
groups are trained on at all.

``GroupStages.from_config`` names the stages a config asks for, so a preset (config's ALGO_PRESETS row) is
only a choice of names and settings; a new algorithm is new registry entries, not a new trainer.
Every stage reads [groups, G] tensors and the config's settings; none does I/O or keeps state.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from coati.algorithm.advantage import compute_advantages, group_accuracy_in_range, overlong_penalty, topk_sample_mask
from coati.algorithm.registry import (  # noqa: F401  (the stages' registries, rows of registry.py)
    GROUP_FILTERS,
    REWARD_SHAPERS,
    SAMPLE_MASKS,
    group_stage,
    register_group_filter,
    register_reward_shaper,
    register_sample_mask,
)


@dataclass(frozen=True)
class GroupTensors:
    """One batch of groups as the stages read it, all [groups, G]."""

    rewards: torch.Tensor  # float32, as the producers scored them
    lengths: torch.Tensor  # float32 response lengths in tokens
    truncated: torch.Tensor  # bool: the response hit max_new_tokens without EOS
    correct: torch.Tensor  # float32 0/1


def shape_overlong(rewards, data: GroupTensors, settings, max_new_tokens: int) -> torch.Tensor:
    return rewards + overlong_penalty(data.lengths, max_new_tokens, settings.cache_length)


def mask_topk(rewards, data: GroupTensors, settings) -> torch.Tensor:
    return topk_sample_mask(rewards, settings.topk_samples)


def mask_truncated(rewards, data: GroupTensors, settings) -> torch.Tensor:
    return ~data.truncated.bool()


def filter_accuracy_range(data: GroupTensors, settings) -> torch.Tensor:
    return group_accuracy_in_range(data.correct, *settings.filter_range)


@dataclass(frozen=True)
class GroupStages:
    shapers: tuple[str, ...]
    advantage: str
    masks: tuple[str, ...]  # applied in this order (topk chooses among the whole group, before truncation)
    filters: tuple[str, ...]

    @classmethod
    def from_config(cls, settings) -> "GroupStages":
        """The stages a group config (``config.algo.groups``) turns on: the shipped ones by their settings, then
        those it names (``reward_shapers``, ``sample_masks``, ``group_filters``: a user's own, by registered name)."""
        def named(key: str) -> tuple[str, ...]:  # settings of any shape: a stand-in without the keys names none
            return tuple(getattr(settings, key, ()))

        return cls(shapers=(("overlong",) if settings.soft_over_length_punishment else ()) + named("reward_shapers"),
                   advantage=settings.advantage,
                   masks=(("topk",) if settings.topk_samples is not None else ())
                   + (("truncated",) if settings.filter_truncated_response else ()) + named("sample_masks"),
                   filters=(("accuracy_range",) if settings.filter_range is not None else ()) + named("group_filters"))

    def run(self, data: GroupTensors, settings, max_new_tokens: int):
        """(shaped rewards, advantages, float 0/1 sample loss mask), each [groups, G]."""
        rewards = data.rewards
        for name in self.shapers:
            rewards = group_stage(REWARD_SHAPERS, name)(rewards, data, settings, max_new_tokens)
        advantages = compute_advantages(rewards, self.advantage, data.lengths)
        keep = torch.ones(rewards.shape, dtype=torch.bool)
        for name in self.masks:
            keep &= group_stage(SAMPLE_MASKS, name)(rewards, data, settings)
        return rewards, advantages, keep.float()

    def keep_groups(self, data: GroupTensors, settings) -> torch.Tensor:
        """[groups] bool: the groups every filter keeps."""
        keep = torch.ones(data.rewards.shape[0], dtype=torch.bool)
        for name in self.filters:
            keep &= group_stage(GROUP_FILTERS, name)(data, settings)
        return keep
