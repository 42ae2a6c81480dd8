"""Packed micro-batches (``--packing``): a micro-batch's rows run through the model as one row without padding, position ids restarting
at every sample and attention kept within each sample, and come back as the logits the padded forward gives.

Only the forward changes shape. A micro-batch keeps its padded ``[B, L]`` tensors, so losses, masks and
statistics read it as before; ``packed_logits`` packs the real tokens into ``[1, T]`` (T: their count), asks the
model for the logits of the positions whose next token is a response token only (HF's ``logits_to_keep`` as a
list of positions), and lays them out as the padded forward's ``[B, k, V]`` (``k``: the micro-batch's
``logits_to_keep`` window, else L). Slots no loss reads (padding, prompt positions in the window) repeat the first
kept position's logits: finite, masked out by every loss.

Keeping attention within a sample is the model's part: transformers' Llama/Qwen2-family models (and every model
built on its masking utilities) read restarting position ids without an attention mask or a KV cache
(``use_cache=False``) as packed samples: a block-diagonal causal mask under sdpa/eager, variable-length kernels
under FlashAttention. A model that does not is found by ``packs_like_padding`` before training (a two-sample
forward compared with the padded one), and the rule (coati/layouts/rule.py) chooses another layout.

Attention over a packed row is as wide as the row under sdpa/eager (the mask only zeroes the cross-sample part),
so such rows are bounded (coati.config.batch_defaults.packed_row_tokens); a variable-length kernel attends within
each sample only.
"""

from __future__ import annotations

import torch

from coati.layouts.base import Layout
from coati.layouts.padded import with_logits_window, window_of
from coati.plugins.base import takes_logits_to_keep


def packed_layout(attention_mask: torch.Tensor, keep: int, action_mask: torch.Tensor | None = None):
    """(position ids [T], logits positions [K], slot map [B, keep]) of right-padded rows packed into one row.

    ``positions``: the packed positions whose logits a loss reads: window slot ``(b, j)`` (column ``L - keep + j``)
    when row b's next token there exists and, given ``action_mask`` ([B, L-1]), is one it scores. ``slots[b, j]``:
    where slot ``(b, j)``'s logits lie among ``positions`` (0 for slots no loss reads)."""
    mask = attention_mask.ne(0)
    rows, width = mask.shape
    lengths = mask.sum(dim=1)
    position_ids = (mask.cumsum(dim=1) - 1)[mask]
    starts = lengths.cumsum(dim=0) - lengths
    columns = torch.arange(width - keep, width)
    read = columns.unsqueeze(0) < (lengths - 1).unsqueeze(1)  # the row's next token exists
    if action_mask is not None:
        scored = torch.nn.functional.pad(action_mask.ne(0), (0, 1))  # [B, L]: column L-1 predicts nothing
        read &= scored[:, width - keep:]
    slots = torch.zeros(rows, keep, dtype=torch.long)
    if not read.any():  # nothing scored (e.g. a data-parallel placeholder): the first position keeps shapes valid
        return position_ids, torch.zeros(1, dtype=torch.long), slots
    positions = (starts.unsqueeze(1) + columns.unsqueeze(0))[read]
    slots[read] = torch.arange(len(positions))
    return position_ids, positions, slots


def packed_logits(model: torch.nn.Module, micro_batch: dict[str, torch.Tensor], keep: int | None,
                  takes_logits_to_keep: bool) -> torch.Tensor:
    """``[B, keep, V]`` logits of a right-padded micro-batch computed as one packed row (module docstring)."""
    input_ids, attention_mask = micro_batch["input_ids"], micro_batch["attention_mask"]
    device = input_ids.device
    keep = keep if keep and takes_logits_to_keep else input_ids.shape[1]  # as wide as the padded forward's
    position_ids, positions, slots = packed_layout(attention_mask.cpu(), keep, _cpu(micro_batch.get("action_mask")))
    flat = input_ids[attention_mask.ne(0)].unsqueeze(0)
    kwargs = {"logits_to_keep": positions.to(device)} if takes_logits_to_keep else {}
    logits = model(input_ids=flat, position_ids=position_ids.unsqueeze(0).to(device), use_cache=False,
                   **kwargs).logits[0]
    if not takes_logits_to_keep:
        logits = logits[positions.to(device)]
    return logits[slots.to(device)]


def _cpu(tensor: torch.Tensor | None) -> torch.Tensor | None:
    return None if tensor is None else tensor.cpu()


@torch.no_grad()
def packs_like_padding(model: torch.nn.Module, tolerance: float = 1e-3) -> bool:
    """Whether ``model`` (full weights, any device) gives two packed samples the logits it gives them padded: its
    attention stays within each sample. A forward that fails or differs means it cannot pack."""
    device = next(model.parameters()).device
    ids = torch.tensor([[5, 6, 7, 8, 9], [3, 4, 5, 0, 0]], device=device)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], device=device)
    was_training = model.training
    model.eval()  # dropout off: the two forwards must be comparable
    try:
        padded = model(input_ids=ids, attention_mask=mask).logits.float()
        packed = model(input_ids=ids[mask.ne(0)].unsqueeze(0), use_cache=False,
                       position_ids=torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2]], device=device)).logits.float()
    except (TypeError, ValueError, RuntimeError):
        return False
    finally:
        model.train(was_training)
    expected = padded[mask.ne(0)]
    scale = max(1.0, float(expected.abs().max()))
    return packed.shape[1] == expected.shape[0] and float((packed[0] - expected).abs().max()) <= tolerance * scale


class PackedLayout(Layout):
    """Rows longest first, as many a micro-batch as ``size`` real tokens hold, each run as one packed row (module
    docstring) with the padded micro-batch's logits window."""
    name = "packed"

    def run_tokens(self, lengths, start, end):
        return sum(lengths[start:end])

    def mark(self, micro_batch):
        return super().mark(with_logits_window(micro_batch))

    def logits(self, model, micro_batch):
        return packed_logits(model, micro_batch, window_of(model, micro_batch), takes_logits_to_keep(model))

    @staticmethod
    def exact(model):
        return packs_like_padding(model)
