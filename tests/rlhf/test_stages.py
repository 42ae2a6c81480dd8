"""The SFT and reward-model stages on the embedded addition task, end to end on the CPU: SFT's loss falls and
its model loads as a causal LM; an SFT and a reward-model step under DDP/FSDP2 x2 (Ray actors, gloo) equal one
process's. The reward model's held-out accuracy on the generated pairs is asserted by the quickstart's e2e test
(tests/e2e/test_rlhf_quickstart.py)."""

from __future__ import annotations

import json
import os

import pytest

from coati.rlhf.cli import resolve_inputs
from coati.config.stage import RMConfig, SFTConfig
from coati.launcher.stage import run_stage
from coati.trainer.stage_tasks import SFTTask


@pytest.fixture(autouse=True)
def no_wandb(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")


def test_sft_collate_masks_exactly_the_completion_and_eos(tiny_model_dir):
    from transformers import AutoTokenizer

    from coati.dataset.rlhf_rows import SFTExample

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    task = SFTTask(tokenizer, "", 64)
    items, skipped = task.tokenise([SFTExample(({"role": "user", "content": "1+2="},), "3"),
                                    SFTExample(({"role": "user", "content": "10+20="},), "30"),
                                    SFTExample(({"role": "user", "content": "1" * 70},), "x")])
    assert skipped == 1 and len(items) == 2
    batch = task.collate(items)
    # row 0: "1+2=" (4 tokens) then "3", EOS: next-token positions 3 and 4 predict them
    assert batch["loss_mask"][0].tolist() == [0, 0, 0, 1, 1, 0, 0, 0]
    assert batch["loss_mask"][1].tolist() == [0, 0, 0, 0, 0, 1, 1, 1]
    assert batch["input_ids"][0, 5].item() == tokenizer.eos_token_id and task.weight(items) == 5.0


def test_sft_on_the_addition_task_lowers_the_loss(tmp_path):
    config = SFTConfig(save_dir=str(tmp_path), batch_size=64, micro_batch_size=64, progress_bar=False)
    model, train, held_out = resolve_inputs(config)
    result = run_stage(config, train, held_out, model, log=lambda line: None)
    assert result.steps == 128  # 8192 rows / 64
    first, last = sum(result.losses[:5]) / 5, sum(result.losses[-5:]) / 5
    assert last < 0.4 * first, (first, last)
    assert result.after["eval_loss"] < 0.4 * result.before["eval_loss"], (result.before, result.after)
    from transformers import AutoModelForCausalLM

    reloaded = AutoModelForCausalLM.from_pretrained(result.model_dir)
    assert os.path.isfile(os.path.join(result.model_dir, "tokenizer.json"))
    rows = [json.loads(line) for line in open(result.metrics_path)]
    assert [r["kind"] for r in rows].count("train") == 128 and rows[0]["kind"] == "eval"
    assert reloaded.config.architectures == ["Qwen2ForCausalLM"]


@pytest.fixture(scope="module")
def local_ray():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    yield
    ray.shutdown()


def stage_steps(tmp_path, model_dir, data, cls, flags: dict):
    config = cls(model=model_dir, save_dir=str(tmp_path), batch_size=8, micro_batch_size=2, eval_fraction=0,
                 learning_rate=1e-4, progress_bar=False, **flags)
    result = run_stage(config, data, None, model_dir, log=lambda line: None)
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    auto = AutoModelForCausalLM if cls is SFTConfig else AutoModelForSequenceClassification
    weights = {name: p.detach() for name, p in auto.from_pretrained(result.model_dir).named_parameters()}
    return result.losses, weights


@pytest.mark.e2e
@pytest.mark.parametrize("label, cls, flags", [("SFT torch DDP x2", SFTConfig, {"num_trainers": 2}),
                                               ("SFT torch FSDP2 x2", SFTConfig, {"num_trainers": 2, "zero_stage": 2}),
                                               ("RM torch FSDP2 x2", RMConfig, {"num_trainers": 2, "zero_stage": 2})])
def test_stage_layout_matches_one_process(tmp_path, local_ray, tiny_model_dir, label, cls, flags):
    """Two steps of 8 rows with uneven lengths (SFT's token normaliser spans both ranks); the saved HF
    directories are compared (FSDP2's is gathered from the shards; the reward model's with its head)."""
    data = tmp_path / "rows.jsonl"
    rows = []
    for a in range(10, 26):
        right, wrong = "\\boxed{" + str(2 * a + 1) * (a % 3 + 1) + "}", "\\boxed{" + str(a) + "}"
        rows.append({"prompt": f"{a}+{a + 1}=", "completion": right, "chosen": right, "rejected": wrong})
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    reference = stage_steps(tmp_path / "one", tiny_model_dir, str(data), cls, {})
    candidate = stage_steps(tmp_path / "two", tiny_model_dir, str(data), cls, flags)
    assert len(reference[0]) == 2
    assert candidate[0] == pytest.approx(reference[0], abs=1e-6), label
    assert candidate[1].keys() == reference[1].keys()
    diff = max(float((candidate[1][n] - reference[1][n]).abs().max()) for n in reference[1])
    assert diff <= 1e-5, f"{label}: weights differ by {diff:.2e}"


def test_row_micro_batches_equal_collating_each_slice_alone(tiny_model_dir):
    """The stage's micro-batches through the learner (-tmbs items, each cut to its longest row) are exactly what
    collating each slice's items alone gives, for SFT rows and for the reward model's pairs (two rows each)."""
    import torch
    from transformers import AutoTokenizer

    from coati.algorithm.batch import row_micro_batches
    from coati.dataset.rlhf_rows import PreferenceExample, SFTExample
    from coati.trainer.stage_tasks import RewardTask

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    user = [({"role": "user", "content": f"{a}+{a}="},) for a in (1, 1234, 56, 7)]
    sft = SFTTask(tokenizer, "", 64)
    rm = RewardTask(tokenizer, "", 64)
    cases = [(sft, sft.tokenise([SFTExample(u, "9" * (i + 1)) for i, u in enumerate(user)])[0], 1),
             (rm, rm.tokenise([PreferenceExample(u, "12", "9" * (3 - i)) for i, u in enumerate(user)])[0], 2)]
    for task, items, rows_per_item in cases:
        for size in (1, 3):
            got = row_micro_batches(task.collate(items), size * rows_per_item)
            want = [task.collate(items[start : start + size]) for start in range(0, len(items), size)]
            assert len(got) == len(want)
            for a, b in zip(got, want):
                assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
