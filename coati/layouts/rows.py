"""Rows for plugins that run a forward of their own (pipeline stages: torch-pp, ColossalAI's hybrid plugin): each
micro-batch ``size`` consecutive rows (-tmbs, per stage), as wide as the minibatch, since a pipeline schedule
concatenates them into one batch of equal micro-batches. They name no layout: the plugin runs its stages on them
and the loss reads full logits (``coati.layouts.base.layout_of``).
"""

from __future__ import annotations

from coati.algorithm.batch import split_micro_batches
from coati.layouts.base import Layout


class RowsLayout(Layout):
    name = "rows"

    def count(self, batch):
        return -(-batch["input_ids"].shape[0] // self.size)

    def split(self, batch, agree=lambda count: count, skip_idle=False):
        # equal shares, equal rows: the same count on every rank, nothing to agree; a pipeline schedule takes
        # micro-batches of equal rows, so every row stays
        return self.cut(batch)

    def cut(self, batch, count=None):
        return split_micro_batches(batch, self.size)

    def logits(self, model, micro_batch):
        return model(input_ids=micro_batch["input_ids"], attention_mask=micro_batch["attention_mask"]).logits
