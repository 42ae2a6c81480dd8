"""The real-model demo's task: the 300 problems, a disjoint split, the last-integer reward by hand, its rows' cache."""

from __future__ import annotations

import pytest

from coati.dataset.arithmetic_task import last_integer, last_integer_reward, problems, splits


def test_the_split_covers_every_problem_once():
    train, held_out = splits(96)
    assert len(problems()) == 300 and (len(train), len(held_out)) == (204, 96)
    prompts = [row["messages"][0]["content"] for row in train + held_out]
    assert len(set(prompts)) == 300
    assert splits(96) == (train, held_out)  # the same seed, the same split
    assert splits(96, seed=1)[1] != held_out  # another seed, another split


@pytest.mark.parametrize("content,gold", [("Calculate 7 * 8.", "56"), ("Calculate 3 - 9.", "-6"),
                                          ("Calculate 0 + 0.", "0")])
def test_rows_carry_the_gold_answer(content, gold):
    rows = {row["messages"][0]["content"]: row["gt_answer"] for row in sum(splits(96), [])}
    assert rows[content] == gold


@pytest.mark.parametrize("response,expected", [
    ("56", 56), ("7 * 8 = 56.", 56), ("The answer is -6", -6), ("3 - 9 is -6, not 6", 6), ("no number", None),
    ("12 apples, then 13", 13)])
def test_last_integer(response, expected):
    assert last_integer(response) == expected


def test_the_reward_is_one_and_correct_only_for_the_gold_last_integer():
    assert last_integer_reward("7 * 8 = 56", "56") == (1.0, {"correct": True})
    assert last_integer_reward("56, or maybe 54", "56") == (0.0, {"correct": False})
    assert last_integer_reward("I cannot say", "56") == (0.0, {"correct": False})
    assert last_integer_reward("The result is -6.", "-6", {"gt_answer": "-6"}) == (1.0, {"correct": True})


def test_a_base_models_answer_is_its_first_integer_and_its_rows_plain_text():
    from coati.dataset.arithmetic_task import first_integer, first_integer_reward, plain_row

    assert [first_integer(text) for text in (" 12\n", " -3 then 4", "no number", "7*8=56")] == [12, -3, None, 7]
    assert first_integer_reward(" 56\n", "56") == (1.0, {"correct": True})
    assert first_integer_reward(" 7 * 8 = 56", "56") == (0.0, {"correct": False})  # what follows is not read
    assert plain_row(7, "*", 8) == {"messages": "What is 7 * 8?", "gt_answer": "56"}
    train, held_out = splits(96, row=plain_row)
    assert len(train) == 204 and all(isinstance(row["messages"], str) for row in train + held_out)


def test_the_demos_rows_are_cached_under_their_wording(tmp_path, monkeypatch):
    """A cache written under an older wording is never reused: the rows' directory is named after the wording."""
    import json
    import os

    from coati.dataset import arithmetic_task
    from coati.demo.smollm2 import task_dir

    first = task_dir(str(tmp_path))
    with open(os.path.join(first, "eval.jsonl")) as handle:
        assert [json.loads(line) for line in handle] == splits(96)[1]
    monkeypatch.setattr(arithmetic_task, "PROMPT", "Calculate {a} {op} {b}. Reply with just the number.")
    second = task_dir(str(tmp_path))
    assert second != first
    with open(os.path.join(second, "eval.jsonl")) as handle:
        assert json.loads(handle.readline())["messages"][0]["content"].endswith("Reply with just the number.")
