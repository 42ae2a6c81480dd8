"""The learner without Ray or a consumer: ``Learner.train_step`` on a rank's share trains exactly the step the
consumer trains; ``TrainState`` keeps what checkpoints kept before it, under the same names."""

from __future__ import annotations

import random

import pytest
import torch

from coati.plugins.mesh import TrainerMesh
from coati.trainer.group_algorithm import GroupAlgorithm
from coati.trainer.learner import Learner, layout_checks
from coati.trainer.roles import ACTOR, TrainedModel
from coati.trainer.step_algorithm import StepContext
from coati.trainer.step_data import StepWork
from coati.trainer.train_state import TrainState
from tests.trainer.test_dapo_e2e import build, make_group, tiny_dir  # noqa: F401 (a fixture)


def one_rank_sum(totals, summed=(), maxima=()):
    return totals  # one rank: the group's totals are its own


# the tiny model's forward pass is mostly overhead: the rule keeps it padded unless a layout is forced on
@pytest.mark.parametrize("flags,kind", [((), "padded"), (("--shared-prompts", "on"), "shared"),
                                        (("--packing", "on"), "packed")])
def test_the_learner_alone_trains_the_consumers_first_step(tiny_dir, monkeypatch, flags, kind):
    from transformers import AutoModelForCausalLM

    consumer, _, _ = build(tiny_dir, monkeypatch, [1, 2, 3, 0], 1, "-lr", "1e-2", "--lr-scheduler", "cosine", *flags)
    assert consumer.learner.layout_choice.name == kind
    want = consumer.step()  # whole groups: the first 4 groups of the round, in draw order
    config = consumer.config
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    policy = TrainedModel.build(ACTOR, config.parallel, model, config.algo.learning_rate, None,
                                mesh=TrainerMesh.build(config.parallel.parallel_dims), optim=config.algo.optim,
                                check_layouts=layout_checks(config, model))
    context = StepContext(config, 0, 1, 0, consumer.pad_id, policy.plugin, one_rank_sum, add_role=None)
    algorithm = GroupAlgorithm(context)
    policy.loss_fn = algorithm.objective.loss
    state = TrainState()
    learner = Learner.for_run(config, state, {ACTOR: policy}, algorithm, context)
    assert learner.layout_choice == consumer.learner.layout_choice  # as the consumer's
    learner.planned_steps = config.groups_per_sync // config.batch.train_batch_size
    groups = [make_group(correct, 0) for correct in (1, 2, 3, 0)]
    got = learner.train_step(StepWork(share=groups, kept=groups, padding=0, info={}, staleness=[0] * 4, prompts=4,
                                      samples=16))
    assert state.step == 1 and state.trained_since_version
    for name in ("loss", "grad_norm", "lr", "entropy", "optimizer_steps"):
        assert got[name] == want[name], name
    trained = consumer.full_state()
    assert all(torch.equal(tensor, trained[name]) for name, tensor in policy.plugin.named_full_tensors())
    second = learner.set_learning_rates()["lr"]  # the cosine schedule moved on with the step
    assert second < got["lr"]


def test_train_state_reads_a_checkpoint_written_before_it():
    torch.manual_seed(5)
    random.seed(5)
    # consumer_state/rank_R.pt as checkpoints held it before TrainState (the consumer's attribute names)
    old = {"counters": {"step_count": 7, "version": 3, "drawn_total": 24, "drawn_since_sync": 2, "_draw_serial": 9,
                        "round_serial": 3},
           "world_size": 1, "torch_rng": torch.get_rng_state(), "python_rng": random.getstate(), "round": None}
    want = (torch.rand(3), random.random())
    state = TrainState()
    state.load_state_dict(old)
    assert (state.step, state.version, state.drawn_total, state.drawn_since_sync, state.draw_serial,
            state.round_serial) == (7, 3, 24, 2, 9, 3)
    assert torch.equal(torch.rand(3), want[0]) and random.random() == want[1]  # the RNG continues where it was
    saved = state.state_dict()
    assert saved["counters"] == old["counters"] and saved["round"] is None
    state.load_state_dict(saved, restore_rng=False)  # another layout: the counters, not the RNG
    assert not torch.equal(torch.rand(3), want[0])


def situation(packing="auto", ragged=True, attention="sdpa", budget=1536, rows=16, sharing="off", plugin_shares=True,
              **shape):
    from coati.layouts.registry import Situation

    capabilities = frozenset({"packs_rows"} | ({"shares_prompts"} if plugin_shares else set()))
    return Situation(ragged=ragged, capabilities=capabilities, flags={"packing": packing, "shared_prompts": sharing},
                     attention=attention, budget=budget, rows=rows, **shape)


def checks(**failed):
    """The rule's ``exact``: every layout passes but those named (with the note why not)."""
    return lambda name: failed.get(name, "")


def unasked(name):
    raise AssertionError(f"the {name} layout's check was asked for")


def test_micro_batching_is_chosen_once_by_plugin_model_and_flag():
    from coati.layouts.rule import choose_layout

    dense = choose_layout(situation("auto"), unasked)  # auto under sdpa, budget over a packed row's bound: padded
    assert (dense.name, dense.size) == ("padded", 1536) and "sdpa attention spans a whole packed row" in dense.line()
    forced = choose_layout(situation("on"))
    assert (forced.name, forced.size) == ("packed", 512)  # dense attention: rows of at most 512 tokens
    assert forced.line().endswith("at most 512 tokens a row")
    assert choose_layout(situation("on", attention="eager", budget=300)).size == 300  # a budget under the bound
    varlen = choose_layout(situation("auto", attention="flash_attention_2"))
    assert (varlen.name, varlen.size, varlen.why) == ("packed", 1536, "")
    off = choose_layout(situation("off", attention="flash_attention_2"), unasked)
    assert (off.name, off.size, off.why) == ("padded", 1536, "")
    cannot = choose_layout(situation("auto", attention="flash_attention_2"),
                           checks(packed="the model's attention crosses"))
    assert cannot.name == "padded" and cannot.line().endswith("; the model's attention crosses")
    with pytest.raises(ValueError, match="^--packing on: the model's attention crosses.*--packing auto or off$"):
        choose_layout(situation("on"), checks(packed="the model's attention crosses"))
    shared = choose_layout(situation("auto", attention="flash_attention_2", sharing="auto"))
    assert (shared.name, shared.size) == ("shared", 1536) and "each group's prompt run once" in shared.line()
    assert choose_layout(situation("on", sharing="auto"), checks(shared="differs")).name == "packed"
    with pytest.raises(ValueError, match="^--shared-prompts on: it needs the single-process plugin"):
        choose_layout(situation("auto", sharing="on", plugin_shares=False))
    rows = choose_layout(situation("auto", ragged=False, rows=8), unasked)  # pipeline stages: rows, whatever flags
    assert (rows.name, rows.size) == ("rows", 8)
    # auto under dense attention is decided without checking the model: an unchecked model is no reason given
    assert "sdpa attention spans" in choose_layout(situation("auto"), unasked).why


@pytest.mark.parametrize("packing,attention,budget,checked", [
    ("off", "flash_attention_2", 1536, False), ("auto", "sdpa", 1536, False), ("auto", "eager", 1536, False),
    ("auto", "flash_attention_2", 1536, True), ("auto", "sdpa", 300, True), ("on", "sdpa", 1536, True)])
def test_the_model_is_checked_for_packing_only_where_it_may_pack(packing, attention, budget, checked):
    from coati.layouts.rule import layouts_to_check

    assert ("packed" in layouts_to_check(situation(packing, attention=attention, budget=budget))) is checked


def test_the_rule_weighs_a_forward_pass_against_the_tokens_it_saves():
    """The cost model by hand: 8 prompts x 8 samples of 64 + 32 tokens, 1,536 tokens a micro-batch."""
    from coati.layouts.registry import packed_cost, padded_cost, pass_tokens, shared_cost
    from coati.layouts.rule import choose_layout, layouts_to_check

    smollm2 = situation(sharing="auto", parameters=135_000_000)
    assert pass_tokens(smollm2) == 128
    assert padded_cost(smollm2) == 64 * 96 + 4 * 128  # 6,144 tokens in 4 passes
    assert shared_cost(smollm2) == 8 * (64 + 8 * 32) + 2 * 2 * 128  # 2,560 tokens: 2 prompt and 2 response passes
    assert packed_cost(smollm2) == pytest.approx((64 * 96 * 0.925 + 12 * 128) * 1.29)  # rows of 512 under sdpa
    assert choose_layout(smollm2).name == "shared" and layouts_to_check(smollm2) == ("shared",)
    # a 0.5M-parameter model, the step in one micro-batch (as the addition demo's): a pass costs 34,560 token
    # positions, a second pass more than the prompts saved (6,144 + 34,560 against 2,560 + 2 x 34,560)
    tiny = situation(sharing="auto", parameters=500_000, budget=64 * 96)
    assert pass_tokens(tiny) == 128 * 270
    assert choose_layout(tiny, unasked).name == "padded" and "not shared: a forward pass" in choose_layout(tiny).why
    # one sample a group (-g 1): nothing shared, one more pass
    assert choose_layout(situation(sharing="auto", samples=1), unasked).name == "padded"
    # the rule asks only for the checks of layouts cheaper than padded rows, cheapest first
    assert layouts_to_check(situation(sharing="auto", attention="flash_attention_2")) == ("shared", "packed")
    second = choose_layout(situation(sharing="auto", attention="flash_attention_2"), checks(shared="differs"))
    assert (second.name, second.why) == ("packed", "differs")


def test_a_new_layout_is_one_file_and_one_row(tiny_dir, monkeypatch):
    """A new micro-batch layout is one file (tests/layouts/one_row.py) and one registry row: the rule weighs it,
    the trainer checks the model for it and trains through it, with the padded step's loss, gradient norm and
    weights."""
    from coati.layouts.registry import LAYOUTS, LayoutSpec, register_layout
    from tests.layouts.one_row import OneRowLayout

    padded, _, _ = build(tiny_dir, monkeypatch, [1, 2, 3, 0], 1, "-lr", "1e-2")
    assert "padded tokens each" in padded.micro_batching_line()
    want = padded.step()
    want_weights = padded.full_state()

    # the registration: its code, its start line, what it needs (nothing beyond ragged micro-batches and a model
    # that passes its check) and its cost (here: the cheapest, so the rule chooses it)
    register_layout(LayoutSpec(
        "one_row", "tests.layouts.one_row:OneRowLayout", "at most {size} padded tokens each, each row run alone",
        cost=lambda situation: 0.0, checked=True, inexact="the model's rows differ alone"))
    try:
        consumer, _, _ = build(tiny_dir, monkeypatch, [1, 2, 3, 0], 1, "-lr", "1e-2")
    finally:
        del LAYOUTS["one_row"]  # the other tests' rule sees the project's rows only
    assert consumer.layout_checks[0] == "one_row" and consumer.roles["actor"].layout_checks["one_row"]
    assert consumer.micro_batching_line().startswith(
        f"trainer micro-batches: at most {consumer.learner.layout_choice.size} padded tokens each, each row run alone")
    before = OneRowLayout.forwards
    got = consumer.step()
    # every sample of the step ran alone, but the group whose samples all scored alike (no gradient: left out)
    assert got["samples_zero_advantage"] == 4 and OneRowLayout.forwards - before == got["samples"] - 4
    for name in ("loss", "grad_norm", "entropy"):
        assert got[name] == pytest.approx(want[name], rel=1e-5, abs=1e-6), name
    weights = consumer.full_state()
    assert all(torch.allclose(tensor, want_weights[name], rtol=1e-5, atol=1e-6) for name, tensor in weights.items())
