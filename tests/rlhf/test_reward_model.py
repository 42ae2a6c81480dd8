"""reward_model_scores / load_reward_model: scores equal one unpadded forward per row of prompt + response + EOS
(the rows RewardTask trains on), whatever the micro-batch; an EOS is added only where missing; directories that
are not reward models are refused with one line."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

from coati.rollout.reward_model import load_reward_model, reward_model_problem, reward_model_scores


@pytest.fixture(scope="module")
def reward_model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny model's body with a seeded random score head, saved as `coati rm` saves one."""
    from transformers import AutoTokenizer

    from coati.trainer.stage_tasks import RewardTask

    torch.manual_seed(0)
    path = str(tmp_path_factory.mktemp("rm"))
    RewardTask.load_model(tiny_model_dir).save_pretrained(path)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def rm(reward_model_dir):
    from transformers import AutoTokenizer

    return load_reward_model(reward_model_dir), AutoTokenizer.from_pretrained(reward_model_dir)


def ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False).input_ids


def one_row_score(model, row):
    with torch.no_grad():
        return model(input_ids=torch.tensor([row])).logits[0, 0].item()


def test_scores_are_unpadded_forwards_of_prompt_response_eos(rm):
    model, tokenizer = rm
    eos = tokenizer.eos_token_id
    prompts = [ids(tokenizer, p) for p in ("12+34=", "5+6=", "99+1=", "1+1=")]
    responses = [ids(tokenizer, "\\boxed{46}") + [eos],  # stopped at EOS: kept as generated
                 ids(tokenizer, "\\boxed{11}"),  # stopped by a stop string / truncated: EOS appended
                 ids(tokenizer, "\\boxed{1000000"),
                 []]  # an empty response is scored as prompt + EOS
    expected = [one_row_score(model, p + (r if r[-1:] == [eos] else r + [eos])) for p, r in zip(prompts, responses)]
    for micro_batch_size in (1, 3, 16):
        scores = reward_model_scores(model, tokenizer, prompts, responses, micro_batch_size)
        assert scores == pytest.approx(expected, abs=1e-5), micro_batch_size
    assert len(set(round(s, 4) for s in expected)) == 4  # the head tells the rows apart: the test is not vacuous
    with_eos = reward_model_scores(model, tokenizer, prompts[1:2], [responses[1] + [eos]], 4)
    assert with_eos == pytest.approx(reward_model_scores(model, tokenizer, prompts[1:2], responses[1:2], 4), abs=1e-6)
    # the pad id as an int (EOS from the model's config) gives the same scores
    by_pad_id = reward_model_scores(model, tokenizer.pad_token_id, prompts, responses, 2)
    assert by_pad_id == pytest.approx(expected, abs=1e-5)


def test_scores_equal_reward_task_training_rows(rm):
    from coati.dataset.rlhf_rows import PreferenceExample
    from coati.trainer.stage_tasks import RewardTask

    model, tokenizer = rm
    pairs = [PreferenceExample(({"role": "user", "content": f"{a}+{b}="},), f"\\boxed{{{a + b}}}", f"\\boxed{{{a}}}")
             for a, b in ((12, 30), (7, 8), (40, 41))]
    task = RewardTask(tokenizer, "", 64)
    items, _ = task.tokenise(pairs)
    batch = task.collate(items)
    with torch.no_grad():
        trained = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, 0].tolist()
    prompts = [ids(tokenizer, p.messages[0]["content"]) for p in pairs for _ in range(2)]
    responses = [ids(tokenizer, text) for p in pairs for text in (p.chosen, p.rejected)]
    assert reward_model_scores(model, tokenizer, prompts, responses, 8) == pytest.approx(trained, abs=1e-5)


def test_bad_arguments_raise(rm):
    model, tokenizer = rm
    with pytest.raises(ValueError, match="2 prompts but 1 responses"):
        reward_model_scores(model, tokenizer, [[3], [4]], [[5]], 2)
    with pytest.raises(ValueError, match="pad id 7 differs from the reward model's config pad_token_id 0"):
        reward_model_scores(model, 7, [[3]], [[5]], 2)
    with pytest.raises(ValueError, match="micro_batch_size must be at least 1"):
        reward_model_scores(model, tokenizer, [[3]], [[5]], 0)


def edit_config(path, **changes):
    config_path = os.path.join(path, "config.json")
    config = json.load(open(config_path))
    config.update(changes)
    json.dump(config, open(config_path, "w"))


def test_directories_that_are_not_reward_models_are_refused(tiny_model_dir, reward_model_dir, tmp_path):
    assert reward_model_problem(reward_model_dir) is None
    cases = {"missing": (str(tmp_path / "nope"), "reward model directory not found or without config.json"),
             "causal": (tiny_model_dir, "has no score head (architectures ['Qwen2ForCausalLM']")}
    two = shutil.copytree(reward_model_dir, tmp_path / "two")
    edit_config(two, id2label={"0": "A", "1": "B"}, label2id={"A": 0, "B": 1})
    cases["labels"] = (str(two), "the score head has 2 labels")
    # a causal LM relabelled as a classifier: transformers would start the head at random
    relabelled = shutil.copytree(tiny_model_dir, tmp_path / "relabelled")
    edit_config(relabelled, architectures=["Qwen2ForSequenceClassification"], id2label={"0": "LABEL_0"},
                label2id={"LABEL_0": 0})
    cases["head weights"] = (str(relabelled), "weights missing from the checkpoint (score.weight)")
    for name, (path, message) in cases.items():
        with pytest.raises(ValueError) as info:
            load_reward_model(path)
        assert message in str(info.value) and "\n" not in str(info.value), (name, str(info.value))
    assert reward_model_problem(str(relabelled)) is None  # only loading finds missing weights
