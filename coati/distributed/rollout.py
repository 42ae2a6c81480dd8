"""What producers hand to trainers: groups of G completions of one prompt, and their collation to tensors."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class RolloutGroup:
    prompt_ids: list[int]
    responses: list[list[int]]  # G token-id lists
    logprobs: list[list[float]]  # behaviour-policy logprobs, one per response token
    rewards: list[float]
    advantages: list[float]
    correct: list[bool]
    format_ok: list[bool]
    finish_reasons: list[str]  # "stop" | "length"
    policy_version: int  # weights version that generated the group
    texts: list[str] = field(default_factory=list)
    prompt_text: str = ""
    source: str = ""  # dataset file:line


def collate(groups: list[RolloutGroup], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded prompt+response rows and per-position tensors aligned with next-token logprobs.

    ``action_mask[b, t]`` is 1 when token ``t + 1`` of row ``b`` is a response token, so it lines up with
    ``logits[:, :-1]``; ``old_logprobs`` sits at the same positions.
    """
    rows, spans, logprobs, advantages = [], [], [], []
    for group in groups:
        for response, logp, advantage in zip(group.responses, group.logprobs, group.advantages):
            rows.append(group.prompt_ids + response)
            spans.append((len(group.prompt_ids), len(response)))
            logprobs.append(logp)
            advantages.append(advantage)
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    action_mask = torch.zeros((len(rows), width - 1), dtype=torch.float32)
    old_logprobs = torch.zeros((len(rows), width - 1), dtype=torch.float32)
    for b, (row, (prompt_len, response_len), logp) in enumerate(zip(rows, spans, logprobs)):
        input_ids[b, : len(row)] = torch.tensor(row)
        attention_mask[b, : len(row)] = 1
        action_mask[b, prompt_len - 1 : prompt_len - 1 + response_len] = 1.0
        old_logprobs[b, prompt_len - 1 : prompt_len - 1 + response_len] = torch.tensor(logp, dtype=torch.float32)
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "action_mask": action_mask,
        "old_logprobs": old_logprobs,
        "advantages": torch.tensor(advantages, dtype=torch.float32),
    }


def split_micro_batches(batch: dict[str, torch.Tensor], size: int) -> list[dict[str, torch.Tensor]]:
    total = batch["input_ids"].shape[0]
    return [{k: v[start : start + size] for k, v in batch.items()} for start in range(0, total, size)]


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log p(input_ids[:, t+1] | prefix) for every t: shape [B, L-1], computed in float32."""
    logits = logits[:, :-1].float()
    if temperature != 1.0:
        logits = logits / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
