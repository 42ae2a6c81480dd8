"""Micro-batch layouts (coati/layouts/: padded rows by token budget with logits only where the loss reads them,
packed rows, shared prompts): the grouping by hand, and the loss and gradients of a real model through them equal
to one unbatched pass with every logit."""

from types import SimpleNamespace

import pytest
import torch

from coati.algorithm.batch import collate, logits_window, row_lengths, token_logprobs, window_token_logprobs
from coati.algorithm.loss import normaliser_from_counts
from coati.algorithm.loss_config import PolicyLossConfig
from coati.layouts.base import layout_of
from coati.layouts.packed import PackedLayout
from coati.layouts.padded import PaddedLayout, with_logits_window
from coati.layouts.shared import SharedPromptsLayout
from coati.plugins.base import LAYOUT, causal_lm_logits, takes_logits_to_keep
from coati.rollout.group import RolloutGroup
from coati.trainer.objective import PolicyObjective


def rows_of(lengths: list[int], prompt: int = 2) -> dict[str, torch.Tensor]:
    """A collated batch of one-response groups: ``prompt`` prompt tokens, then the rest of each length."""
    groups = [RolloutGroup(prompt_ids=list(range(3, 3 + prompt)), responses=[[5] * (length - prompt)],
                           logprobs=[[-1.0] * (length - prompt)], rewards=[0.0], correct=[False], format_ok=[False],
                           finish_reasons=["stop"], policy_version=0) for length in lengths]
    return collate(groups, pad_id=0)


def test_micro_batches_by_hand():
    batch = rows_of([3, 7, 5, 2])  # longest first: rows 1 (7), 2 (5), 0 (3), 3 (2)
    assert row_lengths(batch).tolist() == [3, 7, 5, 2]
    micro = PaddedLayout(10).cut(batch)
    # 10 // 7 = 1 row; 10 // 5 = 2 rows (5 and 3: 2 x 5 = 10 padded tokens); 10 // 2 = 5 rows, one left
    assert [m["input_ids"].shape for m in micro] == [(1, 7), (2, 5), (1, 2)]
    assert [row_lengths(m).tolist() for m in micro] == [[7], [5, 3], [2]]
    assert [m["action_mask"].shape[1] for m in micro] == [6, 4, 1]  # per-position tensors cut with their rows
    assert PaddedLayout(10).count(batch) == 3
    assert len(PaddedLayout(100).cut(batch)) == 1
    assert [m["input_ids"].shape[0] for m in PaddedLayout(1).cut(batch)] == [1, 1, 1, 1]


def test_a_count_splits_the_runs_with_the_most_rows():
    batch = rows_of([4, 4, 4, 4, 3, 3])
    assert PaddedLayout(100).count(batch) == 1
    micro = PaddedLayout(100).cut(batch, count=3)  # 6 rows -> 3 + 3 -> 2 + 1, 3
    assert [m["input_ids"].shape[0] for m in micro] == [2, 1, 3]
    assert sum(m["input_ids"].shape[0] for m in micro) == 6
    with pytest.raises(ValueError, match="needs 6"):
        PaddedLayout(1).cut(batch, count=2)


def test_the_window_starts_at_the_first_response_position():
    batch = rows_of([6, 4], prompt=3)  # responses start at token 3: its logprob is read off position 2
    assert logits_window(batch) == 6 - 2
    batch["action_mask"][:, :] = 0
    batch["action_mask"][1, 3] = 1  # only row 1's second response token is trained on
    assert logits_window(batch) == 6 - 3
    keep = with_logits_window(batch)["logits_to_keep"]
    assert keep.tolist() == [3, 3]
    assert "logits_to_keep" not in with_logits_window({"input_ids": batch["input_ids"]})


def test_window_logprobs_are_the_full_ones_from_the_window_on():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 7, 11, generator=generator)
    ids = torch.randint(0, 11, (2, 7), generator=generator)
    full = token_logprobs(logits, ids)
    windowed = window_token_logprobs(logits[:, -3:], ids)  # positions 4, 5, 6: logprobs of tokens 5 and 6
    assert windowed.shape == full.shape
    assert torch.equal(windowed[:, 4:], full[:, 4:]) and not windowed[:, :4].any()
    assert torch.equal(window_token_logprobs(logits, ids), full)


def test_logits_of_the_scored_positions_only_give_the_full_logprobs_and_entropy_there():
    from coati.algorithm.batch import scored_positions
    from coati.algorithm.loss import token_entropy

    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 6, 11, generator=generator)
    ids = torch.randint(0, 11, (2, 6), generator=generator)
    mask = torch.tensor([[0, 1, 1, 0, 0], [0, 0, 1, 1, 1]], dtype=torch.float32)
    assert scored_positions(mask).tolist() == [1, 2, 7, 8, 9]  # row by row, in [B, L-1]
    scored = logits[:, :-1][mask.bool()]  # [T, V], the layout a shared-prompt forward gives
    micro = {"input_ids": ids, "action_mask": mask}
    read = mask.bool()
    full = token_logprobs(logits, ids, temperature=0.7)
    shared = SharedPromptsLayout(0)  # its forward gives the scored positions only; it reads them so
    got = shared.token_logprobs(scored, micro, temperature=0.7)
    assert got.shape == full.shape and torch.allclose(got[read], full[read]) and not got[~read].any()
    entropy = shared.token_entropy(scored, micro, temperature=0.7)
    assert torch.allclose(entropy[read], token_entropy(logits, 0.7)[read]) and not entropy[~read].any()
    assert torch.equal(PaddedLayout(0).token_logprobs(logits, micro), token_logprobs(logits, ids))  # [B, L, V]
    with pytest.raises(ValueError, match="logits of 4 positions for 5 scored ones"):
        shared.token_logprobs(scored[:4], micro)


@pytest.fixture(scope="module")
def tiny_lm():
    from coati.models.tiny import TinyModelSpec, build_char_tokenizer, build_tiny_model

    return build_tiny_model(TinyModelSpec(), build_char_tokenizer(), seed=3).float()


def test_hf_causal_lms_take_logits_to_keep_and_a_critic_does_not(tiny_lm):
    from transformers import AutoModelForTokenClassification

    assert takes_logits_to_keep(tiny_lm)
    critic = AutoModelForTokenClassification.from_config(tiny_lm.config)
    assert not takes_logits_to_keep(critic)
    ids = torch.tensor([[3, 4, 5, 6]])
    micro = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "logits_to_keep": torch.tensor([2]),
             LAYOUT: PaddedLayout(0)}
    assert causal_lm_logits(tiny_lm, micro).shape[1] == 2
    assert critic(input_ids=ids, attention_mask=torch.ones_like(ids)).logits.shape[1] == 4


def step_batch(vocab: int, loss_variation: str, seed: int = 0, pad_id: int = 0) -> dict[str, torch.Tensor]:
    """Eight samples of differing prompt and response lengths, one sample loss-masked, as group_algorithm makes
    them: advantages, action mask x sample mask, the whole batch's normaliser, reference logprobs."""
    generator = torch.Generator().manual_seed(seed)
    groups = []
    for index in range(4):
        prompt = torch.randint(3, vocab, (int(torch.randint(3, 9, (1,), generator=generator)),), generator=generator)
        responses = [torch.randint(3, vocab, (int(torch.randint(1, 10, (1,), generator=generator)),),
                                   generator=generator).tolist() for _ in range(2)]
        groups.append(RolloutGroup(prompt_ids=prompt.tolist(), responses=responses,
                                   logprobs=[(-torch.rand(len(r), generator=generator) * 3).tolist() for r in responses],
                                   rewards=[0.0, 1.0], correct=[False, True], format_ok=[False] * 2,
                                   finish_reasons=["stop"] * 2, policy_version=0))
    batch = collate(groups, pad_id=pad_id)
    samples = batch["input_ids"].shape[0]
    batch["advantages"] = torch.randn(samples, generator=generator)
    batch["sample_mask"] = torch.ones(samples)
    batch["sample_mask"][5] = 0
    batch["action_mask"] = batch["action_mask"] * batch["sample_mask"].unsqueeze(1)
    counts = batch["action_mask"].sum(dim=1)
    batch["normaliser"] = torch.full((samples,), normaliser_from_counts(counts, loss_variation, 10))
    batch["ref_logprobs"] = batch["old_logprobs"] + 0.1 * torch.randn(batch["old_logprobs"].shape, generator=generator)
    return batch


def loss_and_grads(model, objective, micro_batches) -> tuple[float, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    total = 0.0
    for micro in micro_batches:
        loss, _ = objective.loss(causal_lm_logits(model, micro), micro)
        loss.backward()
        total += float(loss.detach())
    return total, [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("objective_name,loss_variation", [
    ("ppo_clip", "token_level"), ("ppo_clip", "sample_level"), ("ppo_clip", "sample_sum"),
    ("ppo_clip", "sample_sum_norm"), ("gspo", "sample_level"), ("cispo", "token_level")])
def test_budget_micro_batches_give_the_unbatched_loss_and_gradients(tiny_lm, objective_name, loss_variation):
    config = SimpleNamespace(
        algo=SimpleNamespace(loss=PolicyLossConfig(objective=objective_name, loss_variation=loss_variation,
                                                   kl_loss_coef=0.05, clip_eps_high=0.28), ppo_epochs=1),
        sampling=SimpleNamespace(temperature=0.9), batch=SimpleNamespace(train_microbatch_size=8))
    objective = PolicyObjective(config)
    batch = step_batch(tiny_lm.config.vocab_size, loss_variation)
    whole_loss, whole_grads = loss_and_grads(tiny_lm, objective, [batch])  # one pass, every logit
    micro = PaddedLayout(40).cut(batch)
    assert len(micro) >= 3
    assert any(int(m["logits_to_keep"][0]) < m["input_ids"].shape[1] for m in micro)  # the LM head ran on fewer
    assert sum(m["input_ids"].numel() for m in micro) < batch["input_ids"].numel()  # less padding
    loss, grads = loss_and_grads(tiny_lm, objective, micro)
    assert loss == pytest.approx(whole_loss, rel=1e-5, abs=1e-6)
    for got, expected in zip(grads, whole_grads):
        assert torch.allclose(got, expected, rtol=1e-4, atol=1e-6)


def test_packed_runs_count_real_tokens():
    batch = rows_of([3, 7, 5, 2])  # longest first: 7, 5, 3, 2
    micro = PackedLayout(10).cut(batch)
    assert [row_lengths(m).tolist() for m in micro] == [[7], [5, 3, 2]]  # 7 + 5 > 10; 5 + 3 + 2 = 10
    assert all(isinstance(layout_of(m), PackedLayout) for m in micro)  # each names its layout
    assert PackedLayout(10).count(batch) == 2
    assert PaddedLayout(10).count(batch) == 3  # padded: 2 x 5 fits, 3 x 5 does not


def test_packed_layout_by_hand():
    from coati.layouts.packed import packed_layout

    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])  # rows of 4 and 2 tokens: packed positions 0-3 and 4-5
    action = torch.tensor([[0, 1, 1], [1, 0, 0]], dtype=torch.float32)  # row 0 scores tokens 2, 3; row 1 token 1
    position_ids, positions, slots = packed_layout(mask, keep=3, action_mask=action)
    assert position_ids.tolist() == [0, 1, 2, 3, 0, 1]
    # window columns 1, 2, 3: row 0 reads columns 1, 2 (packed 1, 2); row 1 column 1 predicts padding: nothing
    assert positions.tolist() == [1, 2]
    assert slots.tolist() == [[0, 1, 0], [0, 0, 0]]
    _, positions, slots = packed_layout(mask, keep=4)  # no action mask: every position with a next token
    assert positions.tolist() == [0, 1, 2, 4]
    assert slots.tolist() == [[0, 1, 2, 0], [3, 0, 0, 0]]
    _, positions, slots = packed_layout(mask, keep=3, action_mask=torch.zeros(2, 3))  # nothing scored
    assert positions.tolist() == [0] and not slots.any()


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def family_lm(request):
    from coati.models.tiny import TinyModelSpec, build_char_tokenizer, build_tiny_model

    return build_tiny_model(TinyModelSpec(arch=request.param), build_char_tokenizer(), seed=5).float()


@pytest.mark.parametrize("objective_name,loss_variation", [("ppo_clip", "token_level"), ("gspo", "sample_level")])
def test_packed_micro_batches_give_the_padded_loss_and_gradients(family_lm, objective_name, loss_variation):
    """Qwen2 and Llama: samples packed into one row per micro-batch (position ids restarting, attention kept
    within each sample by the model's masking) give the unbatched padded pass's loss and gradients."""
    from coati.layouts.packed import packs_like_padding

    assert packs_like_padding(family_lm)
    config = SimpleNamespace(
        algo=SimpleNamespace(loss=PolicyLossConfig(objective=objective_name, loss_variation=loss_variation,
                                                   kl_loss_coef=0.05), ppo_epochs=1),
        sampling=SimpleNamespace(temperature=0.9), batch=SimpleNamespace(train_microbatch_size=8))
    objective = PolicyObjective(config)
    batch = step_batch(family_lm.config.vocab_size, loss_variation, seed=1)
    whole_loss, whole_grads = loss_and_grads(family_lm, objective, [batch])
    micro = PackedLayout(40).cut(batch)
    assert len(micro) >= 2 and all(m["input_ids"].shape[0] >= 2 for m in micro[1:])  # several samples a row
    loss, grads = loss_and_grads(family_lm, objective, micro)
    assert loss == pytest.approx(whole_loss, rel=1e-5, abs=1e-6)
    for got, expected in zip(grads, whole_grads):
        assert torch.allclose(got, expected, rtol=1e-4, atol=1e-6)


def test_a_model_whose_attention_crosses_samples_cannot_pack(family_lm):
    from coati.layouts.packed import packs_like_padding

    class IgnoresPositions(torch.nn.Module):  # one causal row whatever the position ids say
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=None):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask)

    class NoPositionIds(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask=None):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask)

    assert not packs_like_padding(IgnoresPositions(family_lm))
    assert not packs_like_padding(NoPositionIds(family_lm))
    family_lm.train()
    assert packs_like_padding(family_lm) and family_lm.training  # the probe leaves the mode as it found it


def test_shared_prompt_runs_keep_groups_together():
    batch = step_batch(50, "token_level", seed=2)  # 4 groups of 2 samples
    micro = SharedPromptsLayout(40).cut(batch)
    assert all(isinstance(layout_of(m), SharedPromptsLayout) for m in micro)  # each names its layout
    seen = [sorted(set(m["prompt_group"].tolist())) for m in micro]
    assert sorted(g for groups in seen for g in groups) == [0, 1, 2, 3]  # no group split over two micro-batches
    for m in micro:  # the two passes' tokens stay within the budget (or one row alone)
        prompts, lengths = m["prompt_length"], row_lengths(m)
        cost = len(set(m["prompt_group"].tolist())) * int(prompts.max()) + len(prompts) * int((lengths - prompts).max())
        assert cost <= 40 or len(prompts) == 1
    assert SharedPromptsLayout(40).count(batch) == len(micro)


def test_response_chunks_by_hand():
    from coati.layouts.shared import response_chunks

    lengths = [3, 9, 2, 9, 4]  # longest first: rows 1, 3 (9), 4 (4), 0 (3), 2 (2)
    assert response_chunks(lengths, 0) == [[1, 3], [4], [0], [2]]  # no cost a pass: no padding (ties: fewer)
    assert response_chunks(lengths, 5) == [[1, 3], [4, 0, 2]]  # 18 + 12 + 2 x 5 = 40, the least
    assert response_chunks(lengths, 100) == [[1, 3, 4, 0, 2]]  # one pass, 45 + 100
    assert response_chunks([0, 0], 0) == [[0, 1]]  # an empty response still takes one position


def test_response_places_by_hand():
    from coati.layouts.shared import response_places

    # place 0: the last prompt position (it predicts the first response token); place p: response position p - 1
    places = response_places(torch.tensor([3, 2]), positions=5, response_width=2)
    assert places.tolist() == [[0, 0, 0, 1, 2], [0, 0, 1, 2, 2]]


@pytest.mark.parametrize("objective_name,loss_variation,pass_tokens", [
    ("ppo_clip", "token_level", 256), ("gspo", "sample_level", 256), ("ppo_clip", "token_level", 0)])
def test_shared_prompt_micro_batches_give_the_padded_loss_and_gradients(family_lm, objective_name, loss_variation,
                                                                         pass_tokens, monkeypatch):
    """Qwen2 and Llama: each distinct prompt run once, its samples' responses on its KV cache (in one pass, or in
    chunks of like length), give the unbatched padded pass's loss and gradients (the prompt's gradient is the sum
    over its samples, as the copies' was)."""
    from coati.layouts import shared as shared_prompts
    from coati.layouts.shared import response_chunks, shares_like_padding

    monkeypatch.setattr(shared_prompts, "PASS_TOKENS", pass_tokens)

    assert shares_like_padding(family_lm)
    config = SimpleNamespace(
        algo=SimpleNamespace(loss=PolicyLossConfig(objective=objective_name, loss_variation=loss_variation,
                                                   kl_loss_coef=0.05), ppo_epochs=1),
        sampling=SimpleNamespace(temperature=0.9), batch=SimpleNamespace(train_microbatch_size=8))
    objective = PolicyObjective(config)
    batch = step_batch(family_lm.config.vocab_size, loss_variation, seed=1)
    whole_loss, whole_grads = loss_and_grads(family_lm, objective, [batch])
    micro = SharedPromptsLayout(40).cut(batch)
    assert len(micro) >= 2 and any(m["input_ids"].shape[0] >= 2 for m in micro)
    chunks = [len(response_chunks((row_lengths(m) - m["prompt_length"]).tolist(), pass_tokens)) for m in micro]
    assert max(chunks) == 1 if pass_tokens else max(chunks) >= 2  # one response pass, or several
    loss, grads = loss_and_grads(family_lm, objective, micro)
    assert loss == pytest.approx(whole_loss, rel=1e-5, abs=1e-6)
    for got, expected in zip(grads, whole_grads):
        assert torch.allclose(got, expected, rtol=1e-4, atol=1e-6)
