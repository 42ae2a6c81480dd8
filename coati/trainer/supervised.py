"""The SFT/RM stages' part of the learner's step (learner.py): a supervised feed and the task's loss.

``SupervisedFeed`` yields each step's work: ``batch_size`` items of a per-epoch permutation (seeded), data-parallel
rank k training the k-th contiguous slice. A step's rows depend only on the step and the seed, so a resumed run
trains the batches an uninterrupted one would.

``TaskAlgorithm`` is what the learner hands over to: one minibatch, this rank's share collated by the task
(stage_tasks.py), with the step's global normaliser / dp (completion tokens for SFT, pairs for the reward model)
so that the averaged gradients are those of the whole batch in one process; its objective is the task's loss.
"""

from __future__ import annotations

import random

import torch

from coati.config.errors import ConfigError
from coati.trainer.step_algorithm import StepAlgorithm, StepContext
from coati.trainer.step_data import StepWork


def load_stage_rows(config, train_path: str, eval_path: str | None):
    """(train examples, held-out examples) of the stage's row format, split by --eval-fraction when no -ed."""
    from coati.dataset.loader import DatasetError
    from coati.dataset.rlhf_rows import load_preferences, load_sft

    load = load_sft if config.stage == "sft" else load_preferences
    try:
        train = load(train_path)
        held_out = load(eval_path) if eval_path else []
    except DatasetError as err:
        raise ConfigError(str(err)) from None
    if not eval_path and config.eval_fraction > 0:
        order = list(range(len(train)))
        random.Random(config.seed).shuffle(order)
        count = max(1, int(len(train) * config.eval_fraction))
        held = set(order[:count])
        held_out = [train[i] for i in sorted(held)]
        train = [example for i, example in enumerate(train) if i not in held]
    return train, held_out


class SupervisedFeed:
    def __init__(self, items: list, batch_size: int, seed: int, dp_size: int, dp_rank: int):
        self.items, self.batch_size, self.seed, self.dp_size, self.dp_rank = items, batch_size, seed, dp_size, dp_rank
        self._order = (None, None)  # (epoch, its permutation of the items)

    @property
    def steps_per_epoch(self) -> int:
        return len(self.items) // self.batch_size

    def step_items(self, step: int) -> list:
        """The items of global step ``step`` (0-based): a slice of its epoch's seeded permutation."""
        epoch, index = divmod(step, self.steps_per_epoch)
        if self._order[0] != epoch:  # one permutation per epoch, drawn once
            generator = torch.Generator().manual_seed(self.seed + epoch)
            self._order = (epoch, torch.randperm(len(self.items), generator=generator))
        size = self.batch_size
        return [self.items[i] for i in self._order[1][index * size : (index + 1) * size].tolist()]

    def work(self, step: int) -> StepWork:
        """This rank's share of step ``step`` and the step's whole batch (its normaliser's)."""
        items = self.step_items(step)
        share = len(items) // self.dp_size
        return StepWork(share=items[self.dp_rank * share : (self.dp_rank + 1) * share], kept=items, padding=0)


class TaskObjective:
    """A task's loss as the learner's objective: nothing to prepare per epoch, no weights delivery to check (no
    engine samples in a stage)."""

    def __init__(self, loss):
        self.loss = loss
        self.delivery_version: int | None = None

    def begin_epoch(self, epoch: int) -> None:
        pass


class TaskAlgorithm(StepAlgorithm):
    def __init__(self, context: StepContext, task):
        super().__init__(context, TaskObjective(task.loss_fn))
        self.task = task

    def build_batches(self, share: list, kept: list, padding: int, rows=None) -> list[dict[str, torch.Tensor]]:
        batch = self.task.collate(share)
        normaliser = self.task.weight(kept) / self.context.dp_size
        batch["normaliser"] = torch.full((batch["input_ids"].shape[0],), normaliser)
        return [batch]
