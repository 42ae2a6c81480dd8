"""The code demo's task, tokenizer and cached model (the GRPO gain itself: tests/e2e/test_code_demo_e2e.py)."""

import random

import pytest
from transformers import AutoTokenizer

from coati.dataset.code_demo_task import Spec, all_specs, code_row, completion_text, make_splits, prompt_text
from coati.demo.code_demo import CODE_WORD_TOKENS, CodeDemoRecipe
from coati.models.tiny import build_char_tokenizer, build_tiny_model, save_tiny


def test_specs_read_as_their_programs():
    assert len(all_specs()) == 756 == len(set(all_specs()))
    x = Spec("x", ("times", "minus"), (3, 7))
    assert prompt_text(x) == "x times 3 minus 7:\n"
    assert completion_text(x) == "```python\nx=int(input())\nprint(x*3-7)\n```"
    assert x.solve("-5\n") == "-22\n"
    ab = Spec("ab", ("plus", "times"), (4,))
    assert (ab.statement, ab.expression, ab.solve("3 -2\n")) == ("a plus b times 4", "a+b*4", "-5\n")
    last = Spec("s", ("last",), (3,))
    assert (last.statement, last.program, last.solve("abcdef\n")) == (
        "last 3 letters of s", "s=input()\nprint(s[-3:])\n", "def\n")
    assert Spec("s", ("repeat",), (2,)).solve("ab\n") == "abab\n"


def test_rows_have_distinct_inputs_and_splits_are_disjoint():
    row = code_row(Spec("x", ("plus", "plus"), (2, 3)), random.Random(0), cases=3)
    assert len(set(row["test_cases"]["inputs"])) == 3
    assert row["test_cases"]["outputs"] == [f"{int(x) + 5}\n" for x in row["test_cases"]["inputs"]]
    recipe = CodeDemoRecipe()
    splits = make_splits(recipe.num_train, recipe.num_eval, recipe.num_dev, recipe.seed)
    parts = [set(splits.train), set(splits.eval), set(splits.dev), set(splits.warm)]
    assert sum(map(len, parts)) == len(all_specs()) == len(set().union(*parts))
    assert set(splits.warm_start_specs(2000, seed=1)) <= parts[3]
    with pytest.raises(ValueError, match="keep at most half"):
        make_splits(300, 100, 50, seed=0)


def test_tokenizer_survives_auto_tokenizer(tmp_path):
    tokenizer = build_char_tokenizer(word_tokens=CODE_WORD_TOKENS)
    save_tiny(build_tiny_model(CodeDemoRecipe().spec, tokenizer), tokenizer, str(tmp_path))
    text = prompt_text(Spec("ab", ("minus", "times"), (9,))) + completion_text(Spec("ab", ("minus", "times"), (9,)))
    loaded = AutoTokenizer.from_pretrained(str(tmp_path))
    assert loaded(text).input_ids == tokenizer(text).input_ids
    assert loaded.convert_ids_to_tokens(tokenizer(completion_text(Spec("ab", ("minus", "times"), (9,)))).input_ids) == [
        "```python\n", "a,b=map(int,input().split())\n", "print(", "a", "-", "b", "*", "9", ")\n```"]


@pytest.mark.e2e  # builds the code demo (a warm start scored in the sandbox): about a minute
def test_code_demo_is_partly_right(code_demo_assets):
    """Where GRPO has something to sharpen: the greedy program mostly right, samples mostly not."""
    chosen = code_demo_assets.report["chosen"]
    assert 0.15 <= chosen["sampled"] <= 0.6 and chosen["greedy"] >= 0.6, chosen
