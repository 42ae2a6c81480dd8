"""What every plugin builds the same way (coati/plugins/optim.py): the learning-rate schedules against hand-computed
values and transformers' own, which parameters get weight decay, and one AdamW step's decay against the formula."""

from __future__ import annotations

import math

import pytest
import torch
from equivalence import grpo_batch, grpo_loss_fn, rank_micro_batches, tiny_model

from coati.plugins import make_plugin
from coati.plugins.optim import decays, lr_multiplier, warmup_steps

# total 10 steps, warm-up 2: step -> multiplier, by hand
HAND = {
    "constant": {0: 0.0, 1: 0.5, 2: 1.0, 9: 1.0},
    "linear": {0: 0.0, 1: 0.5, 2: 8 / 8, 6: 4 / 8, 9: 1 / 8},
    "cosine": {0: 0.0, 1: 0.5, 2: 1.0, 4: 0.5 * (1 + math.cos(math.pi / 4)), 6: 0.5, 9: 0.5 * (1 + math.cos(math.pi * 7 / 8))},
}


@pytest.mark.parametrize("schedule", sorted(HAND))
def test_schedules_at_chosen_steps_equal_hand_computed_values(schedule):
    for step, expected in HAND[schedule].items():
        assert lr_multiplier(step, 10, 2, schedule) == pytest.approx(expected, abs=1e-12), (schedule, step)


@pytest.mark.parametrize("schedule", sorted(HAND))
def test_schedules_equal_transformers_own(schedule):
    from transformers import get_scheduler

    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([parameter], lr=1.0)
    name = "constant_with_warmup" if schedule == "constant" else schedule
    theirs = get_scheduler(name, optimizer, num_warmup_steps=3, num_training_steps=12)
    for step in range(12):
        assert lr_multiplier(step, 12, 3, schedule) == pytest.approx(optimizer.param_groups[0]["lr"], abs=1e-12)
        optimizer.step()
        theirs.step()


def test_warmup_steps_win_over_the_ratio_which_rounds_up():
    assert warmup_steps(10, 0, 0.25) == 3
    assert warmup_steps(10, 2, 0.5) == 2
    assert warmup_steps(10, 0, 0.0) == 0
    with pytest.raises(ValueError, match="unknown learning-rate schedule 'step'"):
        lr_multiplier(0, 10, 0, "step")


def test_weight_decay_skips_biases_and_norms():
    model, _ = tiny_model()
    decayed = {name for name, param in model.named_parameters() if decays(name, param)}
    assert "model.embed_tokens.weight" in decayed and "model.layers.0.mlp.up_proj.weight" in decayed
    assert "model.layers.0.self_attn.q_proj.weight" in decayed
    assert "model.layers.0.self_attn.q_proj.bias" not in decayed
    assert "model.layers.1.input_layernorm.weight" not in decayed and "model.norm.weight" not in decayed
    plugin = make_plugin("single")
    plugin.setup(model, 1e-3, weight_decay=0.1)
    groups = {group["weight_decay"]: {id(p) for p in group["params"]} for group in plugin.optimizer.param_groups}
    named = dict(model.named_parameters())
    assert groups[0.1] == {id(named[name]) for name in decayed}
    assert groups[0.0] == {id(p) for name, p in named.items() if name not in decayed}


def test_one_adamw_step_decays_by_the_formula():
    """p1 = p0 (1 - lr wd) - lr g / (|g| + eps) at Adam's first step (bias-corrected m = g, v = g^2); biases and norms
    move by the Adam term alone."""
    lr, wd, eps = 1e-2, 0.1, 1e-8
    model, tokenizer = tiny_model()
    before = {name: param.detach().clone() for name, param in model.named_parameters()}
    plugin = make_plugin("single")
    plugin.setup(model, lr, weight_decay=wd)
    batch = grpo_batch(model.config.vocab_size, tokenizer.pad_token_id)
    plugin.forward_backward(rank_micro_batches(batch, plugin, 2), grpo_loss_fn)
    grads = {name: param.grad.detach().clone() for name, param in model.named_parameters()}
    plugin.optimizer_step(None)
    for name, param in model.named_parameters():
        p0, g = before[name], grads[name]
        decay = wd if decays(name, param) else 0.0
        expected = p0 * (1 - lr * decay) - lr * g / (g.abs() + eps)
        assert torch.allclose(param.detach(), expected, atol=1e-6, rtol=0), name
