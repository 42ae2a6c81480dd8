"""Padded rows by token budget: a minibatch's rows longest first, as many a micro-batch as fit ``size`` padded
tokens (rows x the widest), each micro-batch cut to its widest row; the model's own forward, its LM head on the
last positions only where the loss reads them (HF's ``logits_to_keep``: from the micro-batch's first response
position on, ``coati.algorithm.batch.logits_window``). What every other layout's numbers are held against.
"""

from __future__ import annotations

import torch

from coati.algorithm.batch import logits_window
from coati.layouts.base import Layout, MicroBatch
from coati.plugins.base import takes_logits_to_keep

# [B], every entry the same k: the loss reads the logits of the last k positions only
LOGITS_TO_KEEP = "logits_to_keep"


def with_logits_window(micro_batch: MicroBatch) -> MicroBatch:
    """``micro_batch`` naming, under ``LOGITS_TO_KEEP``, the trailing positions whose logits its loss reads
    (``logits_window``); unchanged without an action mask."""
    keep = logits_window(micro_batch)
    if keep is None:
        return micro_batch
    rows = micro_batch["input_ids"].shape[0]
    return {**micro_batch, LOGITS_TO_KEEP: torch.full((rows,), keep, dtype=torch.long)}


def window_of(model: torch.nn.Module, micro_batch: MicroBatch) -> int | None:
    """The positions whose logits the micro-batch's loss reads where it names them and the model can compute only
    those; else None (every position)."""
    keep = micro_batch.get(LOGITS_TO_KEEP)
    return int(keep[0]) if keep is not None and takes_logits_to_keep(model) else None


class PaddedLayout(Layout):
    name = "padded"

    def run_tokens(self, lengths, start, end):
        return (end - start) * lengths[start]  # rows x the first (widest) row

    def mark(self, micro_batch):
        return super().mark(with_logits_window(micro_batch))

    def logits(self, model, micro_batch):
        keep = window_of(model, micro_batch)
        kwargs = {} if keep is None else {"logits_to_keep": keep}
        return model(input_ids=micro_batch["input_ids"], attention_mask=micro_batch["attention_mask"], **kwargs).logits


def windowed(micro_batch: MicroBatch) -> MicroBatch:
    """A micro-batch cut elsewhere (e.g. a reference model's rows) run as padded rows with its logits window."""
    return PaddedLayout(0).mark(micro_batch)
