"""The code demo (``rl_example.py -rt code`` without a model): a second tiny model that writes programs.

Built once and cached beside the addition demo (``code-demo-<fingerprint>/`` in the demo cache) by
:func:`ensure_code_demo_assets`: the specs of :mod:`coati.dataset.code_demo_task` split into train, held-out
eval and dev rows, and a supervised warm start on specs outside all three that stops, as the addition
demo's does, at the first checkpoint whose *sampled* pass rate on the dev rows (scored in the real sandbox)
reaches ``target_sampled_pass_rate``. The pass rate jumps within ~15 steps (greedy first: it is ~0.97 when
sampled is ~0.15), so GRPO starts from a model whose greedy program is nearly always right but whose
samples mostly are not: RL sharpens it, as it sharpens the addition model. The model is a Llama of the same
size (see the recipe); the tokenizer is the character one plus whole code lines (see CODE_WORD_TOKENS).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from typing import ClassVar

import torch

from coati.dataset.code_demo_task import READ, completion_text, make_splits, prompt_text, write_rows
from coati.dataset.jsonl import Example
from coati.demo.assets import DemoAssets, demo_root, ensure_built
from coati.demo.math_demo import WarmStart, recipe_fingerprint, warm_start
from coati.models.tiny import TinyModelSpec, build_char_tokenizer, build_tiny_model, save_tiny
from rewards.scorer import RewardScorer

# Whole lines a program of the task always writes are single tokens (a tokenizer trained on such code would
# merge them too): a completion is ~10 tokens, its choices (which input line, operators, numbers) a few of
# them, so a sampled program goes wrong only where it has something to decide. At one token per character
# (~30 tokens) every position could go wrong at T=1, and GRPO had to sharpen all of them.
CODE_WORD_TOKENS = ("```python\n", *(line + "\n" for line in READ.values()), "print(", ")\n```", "```")


@dataclass(frozen=True)
class CodeDemoRecipe:
    cache_prefix: ClassVar[str] = "code-demo"
    # Llama, not Qwen2: transformers 5 loads a qwen2 directory's tokenizer as Qwen2Tokenizer, whose byte-level
    # pre-tokenizer drops this vocabulary's spaces and splits its code tokens; a llama one loads as saved.
    spec: TinyModelSpec = TinyModelSpec(arch="llama")
    seed: int = 0
    num_train: int = 192  # 12 rounds of 16 prompts per episode with the demo's flags
    num_eval: int = 96
    num_dev: int = 64
    cases: int = 2  # test inputs per row; scoring (one sandbox run per case) dominates a GRPO step
    batch_size: int = 64
    learning_rate: float = 1e-3
    max_steps: int = 200
    first_check: int = 50  # dev pass rates are ~0 before; each check costs ~128 sandbox runs
    eval_every: int = 5  # the sampled pass rate climbs from ~0.02 to ~0.5 within ~15 steps
    target_sampled_pass_rate: float = 0.15
    max_new_tokens: int = 16

    @property
    def target_sampled_accuracy(self) -> float:  # the name warm_start reads
        return self.target_sampled_pass_rate

    def fingerprint(self) -> str:
        return recipe_fingerprint(self, CODE_WORD_TOKENS)


def ensure_code_demo_assets(cache_dir: str | None = None, recipe: CodeDemoRecipe = CodeDemoRecipe(),
                            log=print) -> DemoAssets:
    """The cached code demo (model, train.jsonl, eval.jsonl, report), built when missing."""
    return ensure_built(demo_root(cache_dir, recipe),
                        lambda out_dir: build_code_demo(out_dir, recipe, log))


def build_code_demo(out_dir: str, recipe: CodeDemoRecipe, log=print) -> None:
    torch.manual_seed(recipe.seed)
    splits = make_splits(recipe.num_train, recipe.num_eval, recipe.num_dev, recipe.seed)
    write_rows(splits.train, os.path.join(out_dir, "train.jsonl"), recipe.seed + 1, recipe.cases)
    write_rows(splits.eval, os.path.join(out_dir, "eval.jsonl"), recipe.seed + 2, recipe.cases)
    dev_path = os.path.join(out_dir, "dev.jsonl")
    write_rows(splits.dev, dev_path, recipe.seed + 3, recipe.cases)
    tokenizer = build_char_tokenizer(word_tokens=CODE_WORD_TOKENS)
    model = build_tiny_model(recipe.spec, tokenizer, seed=recipe.seed)
    with open(dev_path, encoding="utf-8") as handle:
        dev_rows = [json.loads(line) for line in handle]
    data = WarmStart(
        texts=[(prompt_text(s), completion_text(s))
               for s in splits.warm_start_specs(recipe.max_steps * recipe.batch_size, recipe.seed + 4)],
        dev_prompts=[tokenizer(prompt_text(s)).input_ids for s in splits.dev],
        dev_examples=[Example(messages=(), label=row["test_cases"]) for row in dev_rows],
        scorer=RewardScorer("code", {"all_or_nothing": True}), max_new_tokens=recipe.max_new_tokens,
        first_check=recipe.first_check, greedy_every_check=False)
    chosen, history = warm_start(model, tokenizer, recipe, data, log)
    save_tiny(model, tokenizer, os.path.join(out_dir, "model"))
    with open(os.path.join(out_dir, "report.json"), "w") as handle:
        json.dump({"recipe": asdict(recipe), "chosen": chosen, "history": history}, handle, indent=1)
