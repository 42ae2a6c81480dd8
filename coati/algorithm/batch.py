"""The tensors of a training batch: groups collated to padded rows, rows taken and cut to their widest, and the
token logprobs every loss reads off the logits. Pure: no I/O, no Ray.

Per-position tensors ([B, L-1], aligned with ``logits[:, :-1]``) and per-token ones ([B, L]) are cut alike
(``take_rows``); how a minibatch becomes micro-batches is its layout's (coati/layouts/).

Logits only where a loss reads them (``logits_window``): a micro-batch's logits are needed from its first response
position on, so a model that can (HF's ``logits_to_keep``) runs its LM head on the last ``logits_window`` positions
only; ``window_token_logprobs`` reads either width and returns [B, L-1] with zeros before the window (positions
every loss masks out). A forward that computes the scored positions alone (``scored_positions``: where the action
mask is set) gives them as [T, V]: ``scored_token_logprobs``.

``collate`` reads a group by what it carries (``ResponseGroup``: the producers' ``RolloutGroup`` is one), so
this floor needs nothing from the rooms above it.
"""

from __future__ import annotations

from typing import Protocol

import torch



class ResponseGroup(Protocol):
    """What ``collate`` reads of a group: a prompt, its responses with their behaviour logprobs and the weights
    version that sampled them, and each response's per-token loss mask."""
    prompt_ids: list[int]
    responses: list[list[int]]
    logprobs: list[list[float]]
    policy_version: int

    def loss_mask(self, index: int) -> list[int]: ...


def collate(groups: list[ResponseGroup], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded prompt+response rows and per-position tensors aligned with next-token logprobs.

    ``action_mask[b, t]`` is 1 when token ``t + 1`` of row ``b`` is a response token the model wrote (the
    group's loss mask: an environment's tokens inside a multi-turn response are 0), so it lines up with
    ``logits[:, :-1]``; ``old_logprobs`` sits at the same positions. ``policy_version[b]``: the weights version
    that sampled row ``b`` (the weight-delivery check compares it with the trainer's).
    """
    rows, spans, logprobs, masks, versions, owners = [], [], [], [], [], []
    for number, group in enumerate(groups):
        for index, (response, logp) in enumerate(zip(group.responses, group.logprobs)):
            versions.append(group.policy_version)
            owners.append(number)
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
        "policy_version": torch.tensor(versions, dtype=torch.long),  # the weights that sampled each row
        "prompt_length": torch.tensor([prompt for prompt, _ in spans], dtype=torch.long),
        "prompt_group": torch.tensor(owners, dtype=torch.long),  # rows of one group share its prompt
    }


def split_micro_batches(batch: dict[str, torch.Tensor], size: int) -> list[dict[str, torch.Tensor]]:
    """Consecutive row slices of ``batch`` (every tensor alike) of at most ``size`` rows each."""
    total = batch["input_ids"].shape[0]
    return [{k: v[start : start + size] for k, v in batch.items()} for start in range(0, total, size)]


def target_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log p(targets) under ``logits`` ([..., V] and [...]), computed in float32."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log p(input_ids[:, t+1] | prefix) for every t: shape [B, L-1], computed in float32."""
    return target_logprobs(logits[:, :-1], input_ids[:, 1:], temperature)


def window_width(logits: torch.Tensor, input_ids: torch.Tensor) -> int:
    """Positions the logits cover, counted from the end of the rows: all of them (L), or the last k of a model that
    computed its LM head only there (``logits_to_keep=k``)."""
    if logits.shape[1] > input_ids.shape[1]:
        raise ValueError(f"logits of {logits.shape[1]} positions for rows of {input_ids.shape[1]} tokens")
    return logits.shape[1]


def left_pad_positions(values: torch.Tensor, positions: int) -> torch.Tensor:
    """[B, k] values of the last k of ``positions`` per-position slots as [B, positions], zeros before them."""
    missing = positions - values.shape[1]
    return values if missing == 0 else torch.nn.functional.pad(values, (missing, 0))


def window_token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``token_logprobs`` of logits that cover the whole rows or only their last k positions: [B, L-1] either way,
    0 at the positions before the window (a micro-batch's window starts at its first response position, so every
    loss masks those out)."""
    width = window_width(logits, input_ids)
    logprobs = token_logprobs(logits, input_ids[:, input_ids.shape[1] - width:], temperature)
    return left_pad_positions(logprobs, input_ids.shape[1] - 1)


def scored_positions(action_mask: torch.Tensor) -> torch.Tensor:
    """Flat indices into [B, L-1] of the positions a loss reads (``action_mask`` != 0), row by row: a forward that
    computes logits there only (coati.layouts.shared) returns them as [T, V] rows in this order."""
    return action_mask.ne(0).flatten().nonzero().squeeze(1)


def at_scored_positions(values: torch.Tensor, action_mask: torch.Tensor) -> torch.Tensor:
    """[T] values of the scored positions as [B, L-1], zeros elsewhere (positions every loss masks out)."""
    flat = values.new_zeros(action_mask.numel()).index_copy(0, scored_positions(action_mask), values)
    return flat.view(action_mask.shape)


def scored_token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, action_mask: torch.Tensor,
                          temperature: float = 1.0) -> torch.Tensor:
    """``token_logprobs`` of logits of the scored positions only ([T, V], ``scored_positions``'s order): [B, L-1]."""
    positions = scored_positions(action_mask)
    if logits.shape[0] != positions.numel():
        raise ValueError(f"logits of {logits.shape[0]} positions for {positions.numel()} scored ones")
    targets = input_ids[:, 1:].reshape(-1)[positions]
    return at_scored_positions(target_logprobs(logits, targets, temperature), action_mask)


def logits_window(micro_batch: dict[str, torch.Tensor]) -> int | None:
    """Trailing positions whose logits a loss reads: from the micro-batch's first response position to the end
    (``logits_to_keep``); None for a micro-batch without an ``action_mask`` (the logits of every position)."""
    mask = micro_batch.get("action_mask")
    if mask is None or mask.dim() != 2:
        return None
    used = mask.ne(0).any(dim=0).nonzero()
    first = int(used[0]) if len(used) else mask.shape[1] - 1
    return micro_batch["input_ids"].shape[1] - first  # logits at positions first .. L-1; the last predicts nothing


def row_lengths(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Tokens of every row (prompt and response, no padding): right-padded rows end at their last attended token."""
    mask = batch["attention_mask"]
    positions = torch.arange(1, mask.shape[1] + 1).expand_as(mask)
    return (positions * mask.ne(0)).amax(dim=1)


def take_rows(batch: dict[str, torch.Tensor], rows: torch.Tensor) -> dict[str, torch.Tensor]:
    """Rows ``rows`` of every tensor of ``batch``, cut to the widest of them: [B, L] tensors to its length, [B, L-1]
    per-position ones to one less; other tensors (per row) only indexed."""
    width = batch["input_ids"].shape[1]
    keep = max(2, int(row_lengths({"attention_mask": batch["attention_mask"][rows]}).max()))
    out = {}
    for key, value in batch.items():
        value = value[rows]
        if value.dim() >= 2 and value.shape[1] == width:
            value = value[:, :keep]
        elif value.dim() >= 2 and value.shape[1] == width - 1:
            value = value[:, : keep - 1]
        out[key] = value
    return out


def row_micro_batches(batch: dict[str, torch.Tensor], size: int) -> list[dict[str, torch.Tensor]]:
    """Consecutive slices of ``size`` rows of ``batch``, each cut to its own widest row (``take_rows``): what
    collating each slice's rows alone gives."""
    return [take_rows(batch, rows) for rows in torch.arange(batch["input_ids"].shape[0]).split(size)]
