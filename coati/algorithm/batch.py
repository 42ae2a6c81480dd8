"""The tensors of a training batch: groups collated to padded rows, split into micro-batches, and the token
logprobs every loss reads off the logits. Pure: no I/O, no Ray.

``collate`` reads a group by what it carries (``ResponseGroup``: the producers' ``RolloutGroup`` is one), so
this floor needs nothing from the rooms above it.
"""

from __future__ import annotations

from typing import Protocol

import torch


class ResponseGroup(Protocol):
    """What ``collate`` reads of a group: a prompt, its responses with their behaviour logprobs, and each
    response's per-token loss mask."""
    prompt_ids: list[int]
    responses: list[list[int]]
    logprobs: list[list[float]]

    def loss_mask(self, index: int) -> list[int]: ...


def collate(groups: list[ResponseGroup], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded prompt+response rows and per-position tensors aligned with next-token logprobs.

    ``action_mask[b, t]`` is 1 when token ``t + 1`` of row ``b`` is a response token the model wrote (the
    group's loss mask: an environment's tokens inside a multi-turn response are 0), so it lines up with
    ``logits[:, :-1]``; ``old_logprobs`` sits at the same positions.
    """
    rows, spans, logprobs, masks = [], [], [], []
    for group in groups:
        for index, (response, logp) in enumerate(zip(group.responses, group.logprobs)):
            rows.append(group.prompt_ids + response)
            spans.append((len(group.prompt_ids), len(response)))
            logprobs.append(logp)
            masks.append(group.loss_mask(index))
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    action_mask = torch.zeros((len(rows), width - 1), dtype=torch.float32)
    old_logprobs = torch.zeros((len(rows), width - 1), dtype=torch.float32)
    for b, (row, (prompt_len, response_len), logp, mask) in enumerate(zip(rows, spans, logprobs, masks)):
        input_ids[b, : len(row)] = torch.tensor(row)
        attention_mask[b, : len(row)] = 1
        action_mask[b, prompt_len - 1 : prompt_len - 1 + response_len] = torch.tensor(mask, dtype=torch.float32)
        old_logprobs[b, prompt_len - 1 : prompt_len - 1 + response_len] = torch.tensor(logp, dtype=torch.float32)
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "action_mask": action_mask,
        "old_logprobs": old_logprobs,
    }


def split_micro_batches(batch: dict[str, torch.Tensor], size: int) -> list[dict[str, torch.Tensor]]:
    """Consecutive row slices of ``batch`` (every tensor alike) of at most ``size`` rows each."""
    total = batch["input_ids"].shape[0]
    return [{k: v[start : start + size] for k, v in batch.items()} for start in range(0, total, size)]


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log p(input_ids[:, t+1] | prefix) for every t: shape [B, L-1], computed in float32."""
    logits = logits[:, :-1].float()
    if temperature != 1.0:
        logits = logits / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
