"""The learner without Ray or a consumer: ``Learner.train_step`` on a rank's share trains exactly the step the
consumer trains; ``TrainState`` keeps what checkpoints kept before it, under the same names."""

from __future__ import annotations

import random

import pytest
import torch

from coati.plugins.mesh import TrainerMesh
from coati.trainer.group_algorithm import GroupAlgorithm
from coati.trainer.learner import Learner, packing_checked
from coati.trainer.roles import ACTOR, TrainedModel, attention_of
from coati.trainer.step_algorithm import StepContext
from coati.trainer.step_data import StepWork
from coati.trainer.train_state import TrainState
from tests.trainer.test_dapo_e2e import build, make_group, tiny_dir  # noqa: F401 (a fixture)


def one_rank_sum(totals, summed=(), maxima=()):
    return totals  # one rank: the group's totals are its own


@pytest.mark.parametrize("flags,kind", [((), "padded"), (("--shared-prompts", "auto"), "shared"),
                                        (("--packing", "on"), "packed")])
def test_the_learner_alone_trains_the_consumers_first_step(tiny_dir, monkeypatch, flags, kind):
    from transformers import AutoModelForCausalLM

    consumer, _, _ = build(tiny_dir, monkeypatch, [1, 2, 3, 0], 1, "-lr", "1e-2", "--lr-scheduler", "cosine", *flags)
    assert consumer.learner.micro_batching.kind == kind
    want = consumer.step()  # whole groups: the first 4 groups of the round, in draw order
    config = consumer.config
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    policy = TrainedModel.build(ACTOR, config.parallel, model, config.algo.learning_rate, None,
                                mesh=TrainerMesh.build(config.parallel.parallel_dims), optim=config.algo.optim,
                                probe_packing=packing_checked(config, attention_of(model)),
                                probe_sharing=config.batch.shared_prompts != "off")
    context = StepContext(config, 0, 1, 0, consumer.pad_id, policy.plugin, one_rank_sum, add_role=None)
    algorithm = GroupAlgorithm(context)
    policy.loss_fn = algorithm.objective.loss
    state = TrainState()
    learner = Learner.for_run(config, state, {ACTOR: policy}, algorithm, context)
    assert learner.micro_batching == consumer.learner.micro_batching  # as the consumer's
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


def test_micro_batching_is_chosen_once_by_plugin_model_and_flag():
    from coati.trainer.learner import choose_micro_batching

    dense = choose_micro_batching("auto", True, True, "sdpa", 1536, 16)  # auto: a varlen kernel only
    assert (dense.kind, dense.size) == ("padded", 1536) and "sdpa attention spans a whole packed row" in dense.line()
    forced = choose_micro_batching("on", True, True, "sdpa", 1536, 16)
    assert (forced.kind, forced.size) == ("packed", 512)  # dense attention: rows of at most 512 tokens
    assert forced.line().endswith("at most 512 tokens a row")
    assert choose_micro_batching("on", True, True, "eager", 300, 16).size == 300  # a budget under the bound
    varlen = choose_micro_batching("auto", True, True, "flash_attention_2", 1536, 16)
    assert (varlen.kind, varlen.size, varlen.why) == ("packed", 1536, "")
    off = choose_micro_batching("off", True, True, "flash_attention_2", 1536, 16)
    assert (off.kind, off.size, off.why) == ("padded", 1536, "")
    cannot = choose_micro_batching("auto", True, False, "flash_attention_2", 1536, 16, "the model's attention crosses")
    assert cannot.kind == "padded" and cannot.line().endswith("; the model's attention crosses")
    with pytest.raises(ValueError, match="^--packing on: the model's attention crosses.*--packing auto or off$"):
        choose_micro_batching("on", True, False, "sdpa", 1536, 16, "the model's attention crosses")
    shared = choose_micro_batching("auto", True, True, "flash_attention_2", 1536, 16, sharing="auto", shares=True)
    assert (shared.kind, shared.size) == ("shared", 1536) and "each group's prompt run once" in shared.line()
    assert choose_micro_batching("on", True, True, "sdpa", 1536, 16, sharing="auto", shares=False).kind == "packed"
    with pytest.raises(ValueError, match="^--shared-prompts on: it needs the single-process plugin"):
        choose_micro_batching("auto", True, True, "sdpa", 1536, 16, sharing="on", shares=False,
                              sharing_note="it needs the single-process plugin")
    rows = choose_micro_batching("auto", False, True, "sdpa", 1536, 8)  # pipeline stages: rows, whatever --packing
    assert (rows.kind, rows.size) == ("rows", 8)
    # auto under dense attention is decided without checking the model: an unchecked model is no reason given
    assert "sdpa attention spans" in choose_micro_batching("auto", True, False, "sdpa", 1536, 16, "unchecked").why


@pytest.mark.parametrize("packing,attention,budget,checked", [
    ("off", "flash_attention_2", 1536, False), ("auto", "sdpa", 1536, False), ("auto", "eager", 1536, False),
    ("auto", "flash_attention_2", 1536, True), ("auto", "sdpa", 300, True), ("on", "sdpa", 1536, True)])
def test_the_model_is_checked_for_packing_only_where_it_may_pack(packing, attention, budget, checked):
    from types import SimpleNamespace

    from coati.config.batch_defaults import micro_batch_tokens

    config = SimpleNamespace(batch=SimpleNamespace(packing=packing, train_microbatch_tokens=budget))
    assert micro_batch_tokens(config) == budget
    assert packing_checked(config, attention) is checked
