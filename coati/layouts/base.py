"""What every micro-batch layout is: a ``Layout`` owns how it cuts a minibatch into micro-batches, its forward, how
its logits are read into token logprobs and entropy ([B, L-1], as the padded forward's), and the check that a model
gives the padded step's numbers through it.

A micro-batch names its layout under ``coati.plugins.base.LAYOUT`` (the object itself, which travels with the
micro-batch to the plugin's device untouched); a plugin's forward is then the layout's (``causal_lm_logits``) and
a loss reads its logits through ``layout_of(micro_batch)``. A micro-batch that names none (a plugin's own rows, a
reference model's) is read as padded rows' full logits.

Token-budget cutting: the rows sorted by ``order`` and taken in runs whose tokens stay within the
size (``run_tokens``); a row over it goes alone; ``count`` splits the runs with the most rows in half until there are that many
(data-parallel ranks make the same number of forward/backward calls). Each micro-batch is cut to its widest row
(``take_rows``): trailing padding changes no earlier logit, and the losses take the normaliser of the whole batch,
so the micro-batches' losses add up to the batch's whatever the grouping.
"""

from __future__ import annotations

import torch

from coati.algorithm.batch import left_pad_positions, row_lengths, take_rows, window_token_logprobs
from coati.plugins.base import LAYOUT

MicroBatch = dict[str, torch.Tensor]


class Layout:
    """A micro-batch layout of ``size`` (tokens a micro-batch, or rows for ``rows``); its row in registry.py."""
    name = "?"

    def __init__(self, size: int):
        self.size = size

    # -- cutting --------------------------------------------------------------------------------------------
    def order(self, batch: MicroBatch) -> torch.Tensor:
        """The batch's rows in the order micro-batches take them: longest first (ties in row order)."""
        lengths = row_lengths(batch).tolist()
        return torch.tensor(sorted(range(len(lengths)), key=lambda row: (-lengths[row], row)), dtype=torch.long)

    def run_tokens(self, lengths: list[int], start: int, end: int) -> int:
        """Tokens a micro-batch of the rows ``start``..``end - 1`` of ``lengths`` (in order) costs against the size."""
        raise NotImplementedError

    def runs(self, batch: MicroBatch, order: torch.Tensor) -> list[tuple[int, int]]:
        """Consecutive runs [start, end) of ``order`` within the size, greedily; a row over it goes alone."""
        lengths = row_lengths(batch)[order].tolist()
        runs, start = [], 0
        while start < len(lengths):
            end = start + 1
            while end < len(lengths) and self.run_tokens(lengths, start, end + 1) <= self.size:
                end += 1
            runs.append((start, end))
            start = end
        return runs

    def count(self, batch: MicroBatch) -> int:
        """How many micro-batches ``cut`` makes of ``batch`` at most."""
        return len(self.runs(batch, self.order(batch)))

    def cut(self, batch: MicroBatch, count: int | None = None) -> list[MicroBatch]:
        """``batch``'s micro-batches, each naming this layout; ``count`` (>= ``count(batch)``, <= the rows): exactly
        that many, the runs with the most rows split in half until there are."""
        order = self.order(batch)
        runs = self.runs(batch, order)
        if count is not None:
            if not len(runs) <= count <= len(order):
                raise ValueError(f"{count} micro-batches of {len(order)} rows: the budget of {self.size} tokens needs "
                                 f"{len(runs)}")
            while len(runs) < count:
                index = max(range(len(runs)), key=lambda i: (runs[i][1] - runs[i][0], -i))
                start, end = runs[index]
                middle = start + (end - start + 1) // 2
                runs[index : index + 1] = [(start, middle), (middle, end)]
        return [self.mark(take_rows(batch, order[start:end])) for start, end in runs]

    def split(self, batch: MicroBatch, agree=lambda count: count, skip_idle: bool = False) -> list[MicroBatch]:
        """A rank's micro-batches of ``batch``: as many as ``agree`` makes of this rank's count (the largest over
        the data-parallel ranks, collective). ``skip_idle``: rows without a token in the loss (``action_mask`` all
        0) are left out (the loss must give them no gradient: coati/algorithm/idle_rows.py), but for as many as
        make up the agreed count; none at all where no rank has a row to train."""
        if not skip_idle:
            return self.cut(batch, agree(self.count(batch)))
        in_loss = batch["action_mask"].sum(dim=1) > 0
        rows = in_loss.nonzero().flatten()
        trained = take_rows(batch, rows) if len(rows) else None
        count = agree(self.count(trained) if trained is not None else 0)
        if count > len(rows):  # fillers, which add nothing to the loss, its gradient or its statistics
            rows = torch.cat([rows, (~in_loss).nonzero().flatten()[: count - len(rows)]]).sort().values
            trained = take_rows(batch, rows)
        return self.cut(trained, count) if count else []

    def mark(self, micro_batch: MicroBatch) -> MicroBatch:
        """``micro_batch`` naming this layout (and whatever else its forward reads)."""
        return {**micro_batch, LAYOUT: self}

    # -- forward and reading --------------------------------------------------------------------------------
    def logits(self, model: torch.nn.Module, micro_batch: MicroBatch) -> torch.Tensor:
        """The model's logits of ``micro_batch`` through this layout (what ``token_logprobs`` reads)."""
        raise NotImplementedError

    def token_logprobs(self, logits: torch.Tensor, micro_batch: MicroBatch, temperature: float = 1.0) -> torch.Tensor:
        """[B, L-1] token logprobs of the micro-batch (0 where no loss reads); default: logits of every position or
        of the last k ([B, k, V])."""
        return window_token_logprobs(logits, micro_batch["input_ids"], temperature)

    def token_entropy(self, logits: torch.Tensor, micro_batch: MicroBatch, temperature: float = 1.0) -> torch.Tensor:
        """[B, L-1] next-token entropy (a metric, no gradient) at the positions ``token_logprobs`` covers."""
        from coati.algorithm.loss import token_entropy

        return left_pad_positions(token_entropy(logits, temperature), micro_batch["input_ids"].shape[1] - 1)

    # -- exactness ------------------------------------------------------------------------------------------
    @staticmethod
    def exact(model: torch.nn.Module) -> bool:
        """Whether ``model`` (whole, before a plugin lays it out) gives the padded forward's logits through this
        layout; layouts that run the padded forward need no check."""
        return True


class _Unnamed(Layout):
    """How a micro-batch that names no layout is read: padded rows, every position (or a window) of logits."""
    name = "unnamed"

    def logits(self, model, micro_batch):
        return model(input_ids=micro_batch["input_ids"], attention_mask=micro_batch["attention_mask"]).logits


UNNAMED = _Unnamed(0)


def layout_of(micro_batch: MicroBatch) -> Layout:
    """The layout ``micro_batch`` names; padded rows' full logits where it names none."""
    return micro_batch.get(LAYOUT, UNNAMED)
