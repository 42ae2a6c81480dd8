"""Shared-prompt forwards: the G samples of a prompt run the prompt through the model once, not G times.

A GRPO group is one prompt and G responses, and the padded forward computes the prompt in every row: with the
real-model demo's 44-token prompts and 11-30-token responses that is most of a step's work. Here a micro-batch
runs in two passes: its distinct prompts (left-padded, one row each) with a KV cache, then every row's response
on that cache, the cache's rows repeated for the samples that share them. Gradients flow back through the cache
into the one prompt pass, so they add up over the samples as the padded forward's copies would; the loss and
its gradients are the padded forward's within float rounding (tests/algorithm/test_micro_batches.py).

The logits come back as the padded forward's ``[B, k, V]`` window: the last prompt position's logits (which
predict the first response token, the same for every sample of a prompt) and the response positions'. Slots no
loss reads repeat a real position's logits and are masked out by every loss.

A micro-batch names ``SHARED_PROMPTS``; it carries ``prompt_length`` and ``prompt_group`` (``collate``: which
rows share a prompt). Whether a model runs this alike is checked before training (``shares_like_padding``):
transformers' decoder models take a KV cache, explicit position ids and a left-padded attention mask as in
batched generation.
"""

from __future__ import annotations

import torch

SHARED_PROMPTS = "shared_prompts"  # a micro-batch key ([B], all 1): its forward runs the prompts once


def shared_layout(input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_length: torch.Tensor,
                  prompt_group: torch.Tensor, pad_id: int = 0) -> dict[str, torch.Tensor]:
    """The two passes' tensors for right-padded rows (pure): ``prompts`` [U, P] left-padded with its mask, the
    row -> prompt index ``owner`` [B], ``responses`` [B, R] right-padded, the response pass's attention mask over
    cache and responses ``full_mask`` [B, P + R] and position ids ``positions`` [B, R]."""
    rows = input_ids.shape[0]
    lengths = attention_mask.ne(0).sum(dim=1)
    groups, owner = torch.unique(prompt_group, return_inverse=True)
    first = torch.full((len(groups),), rows, dtype=torch.long).scatter_reduce(0, owner, torch.arange(rows), "amin")
    width = int(prompt_length.max())
    prompts = torch.full((len(groups), width), pad_id, dtype=input_ids.dtype)
    prompt_mask = torch.zeros(len(groups), width, dtype=torch.long)
    for index, row in enumerate(first.tolist()):
        n = int(prompt_length[row])
        prompts[index, width - n:] = input_ids[row, :n]
        prompt_mask[index, width - n:] = 1
    response_lengths = lengths - prompt_length
    response_width = max(1, int(response_lengths.max()))
    responses = torch.full((rows, response_width), pad_id, dtype=input_ids.dtype)
    response_mask = torch.zeros(rows, response_width, dtype=torch.long)
    for row in range(rows):
        start, n = int(prompt_length[row]), int(response_lengths[row])
        responses[row, :n] = input_ids[row, start : start + n]
        response_mask[row, :n] = 1
    return {"prompts": prompts, "prompt_mask": prompt_mask, "owner": owner, "responses": responses,
            "full_mask": torch.cat([prompt_mask[owner], response_mask], dim=1),
            "positions": prompt_length.unsqueeze(1) + torch.arange(response_width).unsqueeze(0)}


def window_slots(prompt_length: torch.Tensor, width: int, keep: int, response_width: int) -> torch.Tensor:
    """[B, keep]: for each slot of the padded window (columns L - keep .. L - 1) its place among [the last prompt
    position, the response positions]: column c of row b is place c - (prompt_length[b] - 1), clamped into range
    (slots outside it are ones no loss reads)."""
    columns = torch.arange(width - keep, width).unsqueeze(0)
    return (columns - (prompt_length.unsqueeze(1) - 1)).clamp(0, response_width)


def shared_prompt_logits(model: torch.nn.Module, micro_batch: dict[str, torch.Tensor], keep: int | None,
                         pad_id: int = 0) -> torch.Tensor:
    """``[B, keep, V]`` logits of a right-padded micro-batch computed with each distinct prompt run once."""
    input_ids = micro_batch["input_ids"]
    device = input_ids.device
    keep = keep or input_ids.shape[1]
    layout = {name: value.to(device) for name, value in shared_layout(
        input_ids.cpu(), micro_batch["attention_mask"].cpu(), micro_batch["prompt_length"].cpu(),
        micro_batch["prompt_group"].cpu(), pad_id).items()}
    prompt_positions = (layout["prompt_mask"].cumsum(dim=1) - 1).clamp(min=0)
    first = model(input_ids=layout["prompts"], attention_mask=layout["prompt_mask"], position_ids=prompt_positions,
                  use_cache=True, logits_to_keep=1)
    cache = first.past_key_values
    cache.batch_select_indices(layout["owner"])
    second = model(input_ids=layout["responses"], attention_mask=layout["full_mask"],
                   position_ids=layout["positions"], past_key_values=cache, use_cache=True)
    logits = torch.cat([first.logits[layout["owner"]], second.logits], dim=1)  # [B, 1 + R, V]
    slots = window_slots(micro_batch["prompt_length"].cpu(), input_ids.shape[1], keep,
                         layout["responses"].shape[1]).to(device)
    return logits.gather(1, slots.unsqueeze(-1).expand(-1, -1, logits.shape[-1]))


@torch.no_grad()
def shares_like_padding(model: torch.nn.Module, tolerance: float = 1e-3) -> bool:
    """Whether ``model`` gives two prompts' samples run shared the logits it gives them padded (a forward that
    fails or differs: it cannot)."""
    device = next(model.parameters()).device
    ids = torch.tensor([[5, 6, 7, 8, 9, 0], [5, 6, 7, 4, 0, 0], [3, 4, 5, 6, 7, 8]], device=device)
    mask = ids.ne(0).long()
    micro = {"input_ids": ids, "attention_mask": mask, "prompt_length": torch.tensor([3, 3, 2]),
             "prompt_group": torch.tensor([0, 0, 1])}
    was_training = model.training
    model.eval()
    try:
        padded = model(input_ids=ids, attention_mask=mask).logits.float()
        shared = shared_prompt_logits(model, micro, None).float()
    except (TypeError, ValueError, RuntimeError, AttributeError):
        return False
    finally:
        model.train(was_training)
    # the positions from each row's last prompt token to its last token but one: those a loss reads
    read = torch.zeros_like(mask, dtype=torch.bool)
    for row, (start, end) in enumerate(((2, 5), (2, 4), (1, 6))):
        read[row, start:end] = True
    scale = max(1.0, float(padded[read].abs().max()))
    return float((shared[read] - padded[read]).abs().max()) <= tolerance * scale
