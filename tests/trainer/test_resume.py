"""Checkpoints and ``--resume`` over real Ray runs of the demo model (1 producer, sync mode).

Every run: 32 prompts, -ibs 8 x -g 4, 4 groups per step -> 4 rounds of 2 steps, 8 steps, checkpoints at
steps 3 and 6 (-si 3) and 8. Step 3 is the middle of round 1: the round was drawn at once (round-level
minibatches) and its second part is still to train, so the consumer state keeps the round. A resumed run must
repeat the uninterrupted run's steps 4-8.

Elsewhere, so that no layout is run twice for the same proof: one trainer resumed exactly from step 3 (and its final
weights) in tests/trainer/test_training_knobs.py; a save killed midway and ``--resume latest`` in
tests/trainer/test_async.py.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from run_helpers import head, run_in_module_ray
from transformers import AutoModelForCausalLM

import coati.launcher.checkpoints as checkpointing
from coati.config.cli import build_parser, config_from_args
from coati.config.errors import ConfigError
from coati.launcher.preflight import check_inputs
from coati.utils.checkpoint import COMPLETE_MARKER, list_checkpoints

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]
TOL = 1e-5


@pytest.fixture(scope="module")
def data(demo_assets, tmp_path_factory):
    return head(demo_assets.train_path, tmp_path_factory.mktemp("data") / "train.jsonl", 32)


def configure(demo_assets, data, save_dir, project, *flags):
    argv = ["-d", data, "-ibs", "8", "-imbs", "8", "-g", "4", "-tbs", "4", "-tMbs", "4", "-tmbs", "8", "-e", "1",
            "-si", "3", "-sd", str(save_dir), "-p", project, "--no-progress", *flags]
    config = config_from_args(build_parser().parse_args(argv), demo_assets)
    check_inputs(config)
    return config


def launch(demo_assets, data, save_dir, project, *flags):
    return run_in_module_ray(configure(demo_assets, data, save_dir, project, *flags))


def train_rows(run_dir):
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    return {row["step"]: row for row in rows if row["kind"] == "train"}


def assert_same_steps(reference, resumed, steps, label):
    diff = max(abs(resumed[step]["loss"] - reference[step]["loss"]) for step in steps)
    print(f"{label}: max |loss difference| over steps {list(steps)}: {diff:.3g}")
    for step in steps:
        for key in ("loss", "grad_norm", "reward"):
            assert resumed[step][key] == pytest.approx(reference[step][key], abs=TOL), f"{label}: step {step} {key}"
        assert resumed[step]["weight_version"] == reference[step]["weight_version"], label


def max_weight_diff(dir_a, dir_b) -> float:
    a = AutoModelForCausalLM.from_pretrained(dir_a).state_dict()
    b = AutoModelForCausalLM.from_pretrained(dir_b).state_dict()
    assert a.keys() == b.keys()
    return max(float((a[name] - b[name]).abs().max()) for name in a)


FSDP = ["-t", "2", "-zero", "2", "-tbs", "2", "-tMbs", "2"]  # dp=2 x tbs 2 = the same 4 groups per step


@pytest.fixture(scope="module")
def fsdp_reference(demo_assets, data, tmp_path_factory):
    """The uninterrupted two-rank run whose checkpoints the layout, refusal and cross-layout tests read."""
    save_dir = tmp_path_factory.mktemp("fsdp")
    assert launch(demo_assets, data, save_dir, "ref", *FSDP).steps == 8
    return os.path.join(save_dir, "ref")


def test_checkpoint_layout_and_plain_transformers_load(fsdp_reference):
    assert [step for step, _ in list_checkpoints(fsdp_reference)] == [3, 6, 8]
    step3 = os.path.join(fsdp_reference, "step_3")
    state = json.load(open(os.path.join(step3, checkpointing.RUN_STATE)))
    assert (state["step"], state["policy_version"], state["next_round"], state["pending_groups"]) == (3, 1, 2, 0)
    assert state["producer_rounds"] == [2]  # round 2 waits for weights v2: it cannot have started
    assert state["consumer"]["drawn_since_sync"] == 8 and state["consumer"]["drawn_total"] == 16
    consumer_state = torch.load(os.path.join(step3, "consumer_state", "rank_0.pt"), weights_only=False)
    assert consumer_state["round"]["next_part"] == 1 and consumer_state["round"]["serial"] == 1
    assert [g["policy_version"] for g in consumer_state["round"]["kept"]] == [1] * 8
    for name in ("model.safetensors", "config.json", "tokenizer_config.json", COMPLETE_MARKER,
                 "trainer_state/actor/trainer_state.json", "consumer_state/rank_0.pt"):
        assert os.path.isfile(os.path.join(step3, name)), name
    final = json.load(open(os.path.join(fsdp_reference, "step_8", checkpointing.RUN_STATE)))
    assert final["pending_groups"] == 0 and final["policy_version"] == 4
    model = AutoModelForCausalLM.from_pretrained(step3)  # plain transformers, nothing of ours
    with torch.no_grad():
        assert torch.isfinite(model(torch.tensor([[1, 2, 3]])).logits).all()


def test_resume_errors_at_start_up(demo_assets, data, fsdp_reference, tmp_path):
    with pytest.raises(ConfigError, match="no complete checkpoint"):
        configure(demo_assets, data, tmp_path, "empty", "--resume", "latest")
    partial = tmp_path / "partial"
    shutil.copytree(os.path.join(fsdp_reference, "step_3"), partial)
    os.remove(partial / COMPLETE_MARKER)
    with pytest.raises(ConfigError, match="not a complete checkpoint"):
        configure(demo_assets, data, tmp_path, "x", "--resume", str(partial))
    with pytest.raises(ConfigError, match="inference_batch_size 8 -> 16"):
        configure(demo_assets, data, tmp_path, "x", "-ibs", "16", "-imbs", "16", "--resume",
                  os.path.join(fsdp_reference, "step_3"))
    with pytest.raises(ConfigError, match=r"colossalai-zero \(fp32\) cannot read it"):
        configure(demo_assets, data, tmp_path, "x", "--plugin", "colossalai", "-t", "2", "-zero", "2", "-tbs", "2",
                  "-tMbs", "2", "--resume", os.path.join(fsdp_reference, "step_3"))


def test_fsdp2_checkpoint_resumes_as_single_trainer(demo_assets, data, fsdp_reference, tmp_path):
    """Cross-layout: DCP reshards the FSDP2 shards into one process. The first step after the resume trains
    on the checkpoint's pending groups and equals the FSDP2 run's; later rounds are sampled from weights that
    differ from the FSDP2 run's only by float summation order (~1e-7). (FSDP2 -> FSDP2 resumes exactly in
    tests/plugins/test_state.py; a two-rank run through the driver in the LoRA test below.)"""
    manifest = json.load(open(os.path.join(fsdp_reference, "step_3", "trainer_state", "actor", "trainer_state.json")))
    assert (manifest["plugin"], manifest["world_size"]) == ("torch-fsdp2", 2)
    assert sorted(os.listdir(os.path.join(fsdp_reference, "step_3", "consumer_state"))) == ["rank_0.pt", "rank_1.pt"]
    launch(demo_assets, data, tmp_path, "single", "--resume", os.path.join(fsdp_reference, "step_3"))
    reference, resumed = train_rows(fsdp_reference), train_rows(os.path.join(tmp_path, "single"))
    assert sorted(resumed) == [4, 5, 6, 7, 8]
    assert_same_steps(reference, resumed, [4], "FSDP2x2 -> single")
    later = max(abs(resumed[step]["loss"] - reference[step]["loss"]) for step in range(5, 9))
    print(f"FSDP2x2 -> single: max |loss difference| over steps 5-8 (not asserted): {later:.3g}")


LEARNER = ["--learner-chunk-size", "4", "-si", "1"]  # rounds of 8 producer + 4 learner groups: 3 steps each


@pytest.fixture(scope="module")
def learner_reference(demo_assets, data, tmp_path_factory):
    """One uninterrupted run with learner-side generation, a checkpoint at every step; both resume tests start
    from its checkpoints."""
    save_dir = tmp_path_factory.mktemp("learner")
    reference = launch(demo_assets, data, save_dir, "ref", *LEARNER)
    assert reference.steps == 6  # 32 prompts = 2 rounds of 8 (producer) + 4 (learner) prompts
    return os.path.join(save_dir, "ref")


def test_learner_side_generation_trains_exactly_its_rounds(learner_reference):
    """Each round is 8 producer + 4 learner groups, trained in 3 steps of 4 groups, one publish after it; the
    learner generates once a round, at the first draw of its first step, with the current weights."""
    rows = [train_rows(learner_reference)[step] for step in range(1, 7)]
    assert [r["groups_drawn"] for r in rows] == [4] * 6
    assert [r["weight_version"] for r in rows] == [0, 0, 1, 1, 1, 2]  # a publish after every round
    assert all(r["policy_lag"] == 0 for r in rows)  # learner groups carry the current version too
    assert [sum(r["learner_groups"] for r in rows[i : i + 3]) for i in (0, 3)] == [4, 4]
    assert [r["learner_gen_s"] > 0 for r in rows] == [True, False, False] * 2


@pytest.mark.parametrize("step", [2, 3], ids=["mid-round", "round-boundary"])
def test_resume_with_learner_side_generation_is_exact(demo_assets, data, learner_reference, tmp_path, step):
    """The learner fills a round at the round's first draw: a checkpoint mid-round holds its groups in the
    consumer state (the round was drawn at once); one at a round boundary (step 3) must not wait for them, and
    the resumed learner makes them."""
    state = json.load(open(os.path.join(learner_reference, f"step_{step}", checkpointing.RUN_STATE)))
    # At the boundary v1 was just published: the producer's round 1 is either in the buffer already (stored) or
    # not (regenerated on resume); both resume exactly.
    assert state["pending_groups"] in {2: (0,), 3: (0, 8)}[step]  # step 2: the round is in the consumer state
    checkpoint = os.path.join(learner_reference, f"step_{step}")
    launch(demo_assets, data, tmp_path, "resumed", *LEARNER, "--resume", checkpoint)
    resumed = train_rows(os.path.join(tmp_path, "resumed"))
    assert sorted(resumed) == list(range(step + 1, 7))
    assert_same_steps(train_rows(learner_reference), resumed, range(step + 1, 7), f"learner, step {step}")
    assert sum(resumed[s]["learner_groups"] for s in resumed) == {2: 4, 3: 4}[step]


# LoRA over DDP x2: adapters travel to the producer and the evaluator, the KL term's reference is the policy with its
# adapters off (a forward through DDP), checkpoints hold the PEFT adapter and the adapters' trainer state.
# Only the reference run evaluates (the test reads its evaluations): the evaluator is a process of its own, and
# evaluations change no sample or step.
LORA = ["-t", "2", "-tbs", "2", "-tMbs", "2", "--lora-rank", "4", "--lora-alpha", "8", "-lr", "3e-3", "-kl", "0.05"]


@pytest.fixture(scope="module")
def lora_reference(demo_assets, data, tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("lora")
    evals = ["-ei", "4", "-ed", json.dumps({"addition": data})]
    assert launch(demo_assets, data, save_dir, "ref", *LORA, *evals).steps == 8
    return os.path.join(save_dir, "ref")


def test_lora_run_saves_adapters_and_resumes_exactly(demo_assets, data, lora_reference, tmp_path):
    from coati.models.lora import is_adapter_dir, load_adapted

    step3 = os.path.join(lora_reference, "step_3")
    assert is_adapter_dir(step3) and not os.path.exists(os.path.join(step3, "model.safetensors"))
    manifest = json.load(open(os.path.join(step3, "trainer_state", "actor", "trainer_state.json")))
    assert (manifest["plugin"], manifest["world_size"]) == ("torch-ddp", 2)
    reference = train_rows(lora_reference)
    assert reference[1]["kl"] == pytest.approx(0.0, abs=1e-7)  # the adapters start as the base (B = 0)
    assert all(reference[step]["kl"] > 1e-6 for step in range(2, 9))  # and then move away from it
    evals = [json.loads(line) for line in open(os.path.join(lora_reference, "metrics.jsonl"))]
    assert {row["step"] for row in evals if row["kind"] == "eval"} == {0, 4, 8}

    result = launch(demo_assets, data, tmp_path, "resumed", *LORA, "--resume", step3)
    resumed = train_rows(os.path.join(tmp_path, "resumed"))
    assert sorted(resumed) == [4, 5, 6, 7, 8]
    assert_same_steps(reference, resumed, range(4, 9), "LoRA DDPx2 -> LoRA DDPx2")
    ours = load_adapted(os.path.join(lora_reference, "step_8")).state_dict()
    theirs = load_adapted(result.final_model_dir).state_dict()
    assert max(float((ours[name] - theirs[name]).abs().max()) for name in ours) <= TOL
