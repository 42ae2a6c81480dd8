"""Shared prompts (``--shared-prompts``): the G samples of a prompt run the prompt through the model once, not G times.

A GRPO group is one prompt and G responses, and the padded forward computes the prompt in every row: with the
real-model demo's 44-token prompts and 11-30-token responses that is most of a step's work. Here a micro-batch
runs its distinct prompts (left-padded, one row each) with a KV cache, then the rows' responses on that cache, the
cache's rows repeated for the samples that share them. The responses run in chunks of like length
(``response_chunks``), so one long response does not widen every row. Gradients flow back through the cache into
the one prompt pass, so they add up over the samples as the padded forward's copies would; the loss and its
gradients are the padded forward's within float rounding (tests/algorithm/test_micro_batches.py).

The logits come back at the positions the loss reads only (``[T, V]``, where the action mask is set, row by row:
coati.algorithm.batch.scored_positions): the last prompt position's (which predict the first response token, the
same for every sample of a prompt) and the response positions'. The log-softmax, its backward and the entropy
then run on those alone, not on a padded window.

Micro-batches hold whole groups, as many as fit the budget in both passes' padded tokens (``SharedPromptsLayout``);
they carry ``prompt_length`` and ``prompt_group`` (``collate``: which rows share a prompt). Whether a model runs this alike is checked before training (``shares_like_padding``):
transformers' decoder models take a KV cache, explicit position ids and a left-padded attention mask as in
batched generation.
"""

from __future__ import annotations

import copy

import torch

from coati.algorithm.batch import at_scored_positions, row_lengths, scored_token_logprobs
from coati.layouts.base import Layout
from coati.layouts.registry import PASS_TOKENS  # a response pass's fixed cost (the cost model's measurement)


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


def response_places(prompt_length: torch.Tensor, positions: int, response_width: int) -> torch.Tensor:
    """[B, positions]: each row's logits positions 0 .. positions - 1 as places among [the last prompt position,
    the response positions]: position t of row b is place t - (prompt_length[b] - 1), clamped into range (the
    positions outside it are ones no loss reads)."""
    return (torch.arange(positions).unsqueeze(0) - (prompt_length.unsqueeze(1) - 1)).clamp(0, response_width)


def response_chunks(lengths: list[int], pass_tokens: int) -> list[list[int]]:
    """The response pass's rows as chunks (pure): every chunk is as wide as its longest response, so one wide
    response no longer widens every row; each further chunk costs ``pass_tokens`` (a pass's fixed cost in token
    positions). Rows longest first, cut where the padded tokens plus the passes' cost is least (ties: fewer
    chunks); each chunk's rows longest first."""
    order = sorted(range(len(lengths)), key=lambda row: (-lengths[row], row))
    widths = [max(1, lengths[row]) for row in order]
    best, cut = [0] + [None] * len(order), [0] * (len(order) + 1)
    for end in range(1, len(order) + 1):
        for start in range(end):  # rows start..end-1, as wide as the first of them
            cost = best[start] + (end - start) * widths[start] + pass_tokens
            if best[end] is None or cost < best[end]:
                best[end], cut[end] = cost, start
    chunks, end = [], len(order)
    while end:
        chunks.append(order[cut[end]:end])
        end = cut[end]
    return chunks[::-1]


def _cache_rows(cache, rows: torch.Tensor):
    """A copy of the prompt pass's cache holding ``rows`` of it (indexing keeps the autograd graph: each chunk's
    gradient flows back into the one prompt pass); the original is left as it was for the next chunk."""
    chunk = copy.copy(cache)
    chunk.layers = [copy.copy(layer) for layer in cache.layers]
    chunk.batch_select_indices(rows)
    return chunk


def shared_prompt_logits(model: torch.nn.Module, micro_batch: dict[str, torch.Tensor], pad_id: int = 0,
                         pass_tokens: int | None = None) -> torch.Tensor:
    """``[T, V]`` logits of a right-padded micro-batch at the positions its loss reads (where its action mask is
    set, row by row: coati.algorithm.batch.scored_positions), computed with each distinct prompt run once and the
    responses in chunks of like length (``response_chunks``; ``pass_tokens`` None: ``PASS_TOKENS``)."""
    input_ids = micro_batch["input_ids"]
    device = input_ids.device
    prompt_length = micro_batch["prompt_length"].cpu()
    on_cpu = shared_layout(input_ids.cpu(), micro_batch["attention_mask"].cpu(), prompt_length,
                           micro_batch["prompt_group"].cpu(), pad_id)
    layout = {name: value.to(device) for name, value in on_cpu.items()}
    prompt_positions = (layout["prompt_mask"].cumsum(dim=1) - 1).clamp(min=0)
    first = model(input_ids=layout["prompts"], attention_mask=layout["prompt_mask"], position_ids=prompt_positions,
                  use_cache=True, logits_to_keep=1)
    prompt_width = layout["prompts"].shape[1]
    lengths = on_cpu["full_mask"][:, prompt_width:].sum(dim=1).tolist()
    owner = on_cpu["owner"]
    positions = input_ids.shape[1] - 1
    # all the logits computed, flat: each prompt's last position (it predicts its samples' first response token),
    # then each chunk's response positions; ``places`` [B, L-1] says where each position's logits are
    pieces, offset = [first.logits[:, -1]], first.logits.shape[0]
    places = torch.empty(input_ids.shape[0], positions, dtype=torch.long)
    pass_tokens = PASS_TOKENS if pass_tokens is None else pass_tokens
    for chunk in response_chunks(lengths, pass_tokens):
        rows = torch.tensor(chunk, dtype=torch.long)
        width = max(1, max(lengths[row] for row in chunk))
        index = rows.to(device)
        out = model(input_ids=layout["responses"][index, :width],
                    attention_mask=layout["full_mask"][index, :prompt_width + width],
                    position_ids=layout["positions"][index, :width],
                    past_key_values=_cache_rows(first.past_key_values, layout["owner"][index]), use_cache=True)
        pieces.append(out.logits.flatten(0, 1))  # [rows x width, V]
        slots = response_places(prompt_length[rows], positions, width)
        responses = offset + torch.arange(len(chunk)).unsqueeze(1) * width + slots - 1
        places[rows] = torch.where(slots == 0, owner[rows].unsqueeze(1), responses)
        offset += len(chunk) * width
    scored = micro_batch["action_mask"].cpu().ne(0).flatten()
    return torch.cat(pieces).index_select(0, places.flatten()[scored].to(device))


@torch.no_grad()
def shares_like_padding(model: torch.nn.Module, tolerance: float = 1e-3) -> bool:
    """Whether ``model`` gives two prompts' samples run shared the logits it gives them padded (a forward that
    fails or differs: it cannot)."""
    device = next(model.parameters()).device
    ids = torch.tensor([[5, 6, 7, 8, 9, 0], [5, 6, 7, 4, 0, 0], [3, 4, 5, 6, 7, 8]], device=device)
    mask = ids.ne(0).long()
    micro = {"input_ids": ids, "attention_mask": mask, "prompt_length": torch.tensor([3, 3, 2]),
             "prompt_group": torch.tensor([0, 0, 1])}
    # the positions whose next token is a response token: those a loss reads (the action mask)
    read = torch.zeros(3, 5, dtype=torch.bool)
    for row, (start, end) in enumerate(((2, 4), (2, 3), (1, 5))):
        read[row, start:end] = True
    micro["action_mask"] = read.float()
    was_training = model.training
    model.eval()
    try:
        padded = model(input_ids=ids, attention_mask=mask).logits.float()[:, :-1][read]
        shared = shared_prompt_logits(model, micro).float()
    except (TypeError, ValueError, RuntimeError, AttributeError):
        return False
    finally:
        model.train(was_training)
    scale = max(1.0, float(padded.abs().max()))
    return shared.shape == padded.shape and float((shared - padded).abs().max()) <= tolerance * scale


def shared_runs(prompts: list[int], responses: list[int], groups: list[int], budget: int) -> list[tuple[int, int]]:
    """Consecutive runs [start, end) of rows in shared-prompt order (each group's rows together) within ``budget``
    tokens of the two passes: distinct prompts x the longest prompt, plus rows x the longest response. Whole groups
    while they fit; a group over the budget alone is cut by rows (a row over it goes alone)."""

    def cost(start: int, end: int) -> int:
        return (len(set(groups[start:end])) * max(prompts[start:end])
                + (end - start) * max(responses[start:end]))

    spans, start = [], 0
    for row in range(1, len(groups) + 1):
        if row == len(groups) or groups[row] != groups[start]:
            spans.append((start, row))
            start = row
    runs, current = [], None
    for first, last in spans:
        if current is not None and cost(current[0], last) <= budget:
            current = (current[0], last)
            continue
        if current is not None:
            runs.append(current)
        current = None
        if cost(first, last) <= budget:
            current = (first, last)
            continue
        row = first
        while row < last:  # the group alone is over the budget: by rows
            end = row + 1
            while end < last and cost(row, end + 1) <= budget:
                end += 1
            runs.append((row, end))
            row = end
    if current is not None:
        runs.append(current)
    return runs


class SharedPromptsLayout(Layout):
    """Whole groups a micro-batch, each group's prompt run once (module docstring); logits at the scored positions
    only ([T, V])."""
    name = "shared"

    def order(self, batch):
        """Whole groups (``prompt_group``) longest first, each group's rows longest first."""
        lengths = row_lengths(batch).tolist()
        groups = batch["prompt_group"].tolist()
        longest: dict[int, int] = {}
        for row, group in enumerate(groups):
            longest[group] = max(longest.get(group, 0), lengths[row])
        return torch.tensor(sorted(range(len(lengths)), key=lambda row: (-longest[groups[row]], groups[row],
                                                                          -lengths[row], row)), dtype=torch.long)

    def runs(self, batch, order):
        lengths = row_lengths(batch)[order]
        prompts = batch["prompt_length"][order]
        return shared_runs(prompts.tolist(), (lengths - prompts).tolist(), batch["prompt_group"][order].tolist(),
                           self.size)

    def logits(self, model, micro_batch):
        return shared_prompt_logits(model, micro_batch)

    def token_logprobs(self, logits, micro_batch, temperature=1.0):
        return scored_token_logprobs(logits, micro_batch["input_ids"], micro_batch["action_mask"], temperature)

    def token_entropy(self, logits, micro_batch, temperature=1.0):
        from coati.algorithm.loss import token_entropy

        return at_scored_positions(token_entropy(logits, temperature), micro_batch["action_mask"])

    @staticmethod
    def exact(model):
        return shares_like_padding(model)
