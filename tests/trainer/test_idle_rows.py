"""Rows the loss gives no gradient (advantage 0, or outside the loss) skip the forward and backward: the step's
gradients and weights are those of the step that ran them, its statistics are means over the rows trained, and a
loss that would give such rows a gradient (a KL term, a user's own) keeps them all."""

from __future__ import annotations

import json

import pytest
import torch

from coati.algorithm.idle_rows import check_idle_rows
from coati.algorithm.loss_config import PolicyLossConfig
from coati.algorithm.policy_losses import policy_loss
from coati.algorithm.registry import LOSS_AGGREGATIONS, POLICY_LOSSES, get_policy_loss
from coati.layouts.padded import PaddedLayout
from tests.trainer.test_dapo_e2e import G, build, tiny_dir  # noqa: F401 (a fixture)


@pytest.mark.parametrize("objective", sorted(POLICY_LOSSES))
def test_every_shipped_loss_gives_idle_rows_no_gradient_unless_it_has_a_kl_term(objective):
    for variation in LOSS_AGGREGATIONS:
        for correction in ("behaviour", "decoupled"):
            config = PolicyLossConfig(objective=objective, loss_variation=variation, correction=correction)
            found = check_idle_rows(get_policy_loss(objective), config)
            assert found.inert, (variation, correction)
            # the rows left out add nothing to the loss, nor to the clip fractions where the clip needs an advantage
            # (CISPO's weight is clipped whatever the advantage); they do to the off-policy means
            clipped = set() if objective == "cispo" else {"clip_fraction", "clip_fraction_low", "clip_fraction_high"}
            assert {"loss"} | clipped <= found.unchanged_stats
            assert objective != "cispo" or "clip_fraction" not in found.unchanged_stats
            assert not {"kl_behaviour", "is_weight", "mismatch_k3"} & found.unchanged_stats
    with_kl = PolicyLossConfig(objective=objective, kl_loss_coef=0.05)
    assert not check_idle_rows(get_policy_loss(objective), with_kl).inert


def test_a_loss_that_reaches_idle_rows_keeps_them():
    def with_bonus(inputs, config):  # a per-token term on every token of the micro-batch, whatever its advantage
        loss, stats = policy_loss(inputs, config)
        return loss - 1e-3 * inputs.logprobs.sum(), stats

    def without_mask(inputs, config):  # reads rows outside the loss
        loss, stats = policy_loss(inputs, config)
        return loss + 1e-3 * (inputs.logprobs * inputs.advantages.unsqueeze(1)).sum(), stats

    def constant(inputs, config):  # no gradient anywhere: nothing proves the rows idle
        return inputs.logprobs.sum().detach() * 0, {}

    assert check_idle_rows(lambda i, c: policy_loss(i, c), PolicyLossConfig()).inert
    for loss in (with_bonus, without_mask, constant):
        assert not check_idle_rows(loss, PolicyLossConfig()).inert, loss.__name__


def _rows(lengths: list[int], idle: list[int]) -> dict:
    width = max(lengths)
    mask = torch.zeros(len(lengths), width - 1)
    for row, length in enumerate(lengths):
        if row not in idle:
            mask[row, 1 : length - 1] = 1.0
    return {"input_ids": torch.ones(len(lengths), width, dtype=torch.long),
            "attention_mask": (torch.arange(width) < torch.tensor(lengths).unsqueeze(1)).long(),
            "action_mask": mask, "row": torch.arange(len(lengths))}


def test_a_split_leaves_idle_rows_out_but_for_the_count_the_ranks_agree_on():
    layout, batch = PaddedLayout(16), _rows([8, 6, 9, 4, 5, 7], idle=[0, 2, 3])
    own = layout.split(batch, skip_idle=True)
    assert sorted(int(r) for m in own for r in m["row"]) == [1, 4, 5]
    assert len(own) == 2 and all(m["input_ids"].shape[1] <= 7 for m in own)  # cut to the widest row trained
    more = layout.split(batch, agree=lambda count: 4, skip_idle=True)  # another rank needs 4 micro-batches
    assert len(more) == 4 and sorted(int(r) for m in more for r in m["row"]) == [0, 1, 4, 5]
    nothing = _rows([8, 6], idle=[0, 1])
    assert layout.split(nothing, skip_idle=True) == []  # no rank trains a row of this minibatch
    assert len(layout.split(nothing, agree=lambda count: 1, skip_idle=True)) == 1
    assert sorted(int(r) for m in layout.split(batch) for r in m["row"]) == list(range(6))  # off: every row


def _counting_rows(consumer) -> list[int]:
    seen, plugin = [], consumer.learner.roles["actor"].plugin
    forward_backward = plugin.forward_backward

    def counted(micro_batches, loss_fn):
        seen.append(sum(int(m["input_ids"].shape[0]) for m in micro_batches))
        return forward_backward(micro_batches, loss_fn)

    plugin.forward_backward = counted
    return seen


# pattern: right answers per group of G (rewards 1 or 0.1); groups 1 and 3 / 0 and 1 all right: advantage 0
@pytest.mark.parametrize("flags,pattern", [((), [1, G, 2, G]), (("--shared-prompts", "on"), [G, G, 1, 3]),
                                           (("--packing", "on"), [1, G, 2, G])])
def test_a_step_without_its_idle_rows_trains_the_same_weights(tiny_dir, monkeypatch, flags, pattern):
    runs = {}
    for skip in (True, False):
        consumer, _, _ = build(tiny_dir, monkeypatch, pattern, 1, "-lr", "1e-2", *flags, "--grpo-config",
                               json.dumps({"skip_idle_samples": skip}))
        rows = _counting_rows(consumer)
        metrics = consumer.step()
        runs[skip] = metrics, rows, consumer.full_state()
    (skipped, skipped_rows, after), (full, full_rows, want) = runs[True], runs[False]
    assert full_rows == [2 * G, 2 * G] and skipped["samples_zero_advantage"] == full["samples_zero_advantage"] == 2 * G
    assert sum(skipped_rows) == 2 * G  # the idle groups' rows never reached the forward
    for name, tensor in want.items():
        torch.testing.assert_close(after[name], tensor, rtol=1e-5, atol=1e-6, msg=name)
    assert skipped["grad_norm"] == pytest.approx(full["grad_norm"], rel=1e-5)
    # the idle rows add nothing to the loss and the clip fraction: the whole step's; the entropy and the off-policy
    # means are over the rows trained
    assert skipped["loss"] == pytest.approx(full["loss"], rel=1e-5, abs=1e-8)
    assert skipped["clip_fraction"] == pytest.approx(full["clip_fraction"], abs=1e-8)
    assert skipped["entropy"] > 0 and skipped["entropy"] == pytest.approx(full["entropy"], rel=0.2)
    assert skipped["kl_behaviour"] == pytest.approx(full["kl_behaviour"], rel=0.5)


def test_a_step_where_no_row_would_train_keeps_them_all(tiny_dir, monkeypatch):
    consumer, _, _ = build(tiny_dir, monkeypatch, [G], 1, "-lr", "1e-2")
    rows = _counting_rows(consumer)
    metrics = consumer.step()
    assert rows == [2 * G, 2 * G] and metrics["samples_zero_advantage"] == 4 * G
    assert metrics["entropy"] > 0 and metrics["grad_norm"] == 0.0
