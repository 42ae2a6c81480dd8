"""The embedded demo: a tiny Qwen2, its tokenizer, the addition task, and a short supervised warm start.

``ensure_demo_assets()`` returns the cached assets, building them when missing (about 20-40 s on 2 cores).
The warm start stops at the first checkpoint whose *sampled* accuracy on a dev split reaches
``target_sampled_accuracy``: accuracy jumps within ~100 steps, so the checkpoint is chosen by evaluation,
not by step count, and GRPO starts from a model that is partly right. Run ``python -m coati.demo``
(``--code`` for the code demo of :mod:`coati.demo.code_demo`) to (re)build by hand.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from typing import ClassVar

import torch

from coati.config.sampling import SamplingParams
from coati.demo.assets import DemoAssets, demo_root, ensure_built
from coati.utils.cache import build_once, default_cache_dir
from coati.dataset.demo_task import completion_text, make_splits, prompt_text, write_jsonl
from coati.dataset.jsonl import Example
from coati.models.tiny import (
    DEFAULT_CHARS,
    WORD_TOKENS,
    TinyModelSpec,
    build_char_tokenizer,
    build_tiny_model,
    save_tiny,
)
from coati.rollout.evaluation import evaluate
from coati.rollout.inference_backend import TransformersBackend
from rewards.scorer import RewardScorer


@dataclass(frozen=True)
class DemoRecipe:
    cache_prefix: ClassVar[str] = "demo"
    spec: TinyModelSpec = TinyModelSpec()
    seed: int = 0
    digits: int = 2  # a 2-layer model learns 2-digit sums in ~300 steps; 3-digit sums stalled near 10%
    num_train: int = 2048
    num_eval: int = 512
    num_dev: int = 256
    batch_size: int = 64
    learning_rate: float = 1e-3
    max_steps: int = 1000
    eval_every: int = 25
    target_sampled_accuracy: float = 0.25

    def fingerprint(self) -> str:
        return recipe_fingerprint(self, WORD_TOKENS)


def recipe_fingerprint(recipe, words) -> str:
    """Names a demo's cache directory: a change to its recipe or its tokenizer's alphabet rebuilds."""
    payload = json.dumps({"recipe": asdict(recipe), "chars": DEFAULT_CHARS, "words": words}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:10]


def ensure_demo_assets(cache_dir: str | None = None, recipe: DemoRecipe = DemoRecipe(), log=print) -> DemoAssets:
    return ensure_built(demo_root(cache_dir, recipe), lambda out_dir: build_demo(out_dir, recipe, log))


def ensure_base_model(cache_dir: str | None = None, recipe: DemoRecipe = DemoRecipe()) -> str:
    """The demo's tiny model *before* its warm start (random weights, the demo's tokenizer), saved once: the
    starting point of ``coati sft`` on the embedded task."""
    path = os.path.join(cache_dir or default_cache_dir(), f"base-{recipe.fingerprint()}")

    def build(out_dir: str) -> None:
        tokenizer = build_char_tokenizer()
        save_tiny(build_tiny_model(recipe.spec, tokenizer, seed=recipe.seed), tokenizer, out_dir)

    build_once(path, "config.json", build)
    return path


def _sft_batch(texts: list[tuple[str, str]], tokenizer):
    """Prompt + completion + EOS, right-padded; labels only on completion tokens (-100 elsewhere)."""
    rows, labels = [], []
    for prompt_str, completion_str in texts:
        prompt = tokenizer(prompt_str).input_ids
        answer = tokenizer(completion_str).input_ids + [tokenizer.eos_token_id]
        rows.append(prompt + answer)
        labels.append([-100] * len(prompt) + answer)
    width = max(map(len, rows))
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    label_ids = torch.tensor([r + [-100] * (width - len(r)) for r in labels])
    return input_ids, (input_ids != pad).long(), label_ids


@dataclass(frozen=True)
class WarmStart:
    """What :func:`warm_start` needs besides the model: the supervised (prompt, completion) texts, taken
    ``batch_size`` at a time, and the dev split whose sampled accuracy decides when to stop."""

    texts: list[tuple[str, str]]
    dev_prompts: list[list[int]]
    dev_examples: list[Example]
    scorer: RewardScorer
    max_new_tokens: int
    first_check: int = 0  # no dev check before this step (each check of a code model runs the sandbox)
    greedy_every_check: bool = True  # False: greedy accuracy only at the chosen checkpoint


def warm_start(model, tokenizer, recipe, data: WarmStart, log=print) -> tuple[dict, list[dict]]:
    """Supervised steps until the dev split's sampled accuracy reaches ``recipe.target_sampled_accuracy``
    (checked every ``recipe.eval_every`` steps, at most ``recipe.max_steps``); returns (chosen, history)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.learning_rate)

    def dev_accuracy(temperature: float) -> float:
        backend = TransformersBackend(model, tokenizer, prompts_per_call=256)
        params = SamplingParams(temperature=temperature, max_new_tokens=data.max_new_tokens)
        accuracy = evaluate(backend, data.dev_prompts, data.dev_examples, data.scorer, params).accuracy
        model.train()
        return accuracy

    history = []
    model.train()
    for step in range(1, recipe.max_steps + 1):
        batch = data.texts[(step - 1) * recipe.batch_size : step * recipe.batch_size]
        input_ids, attention_mask, labels = _sft_batch(batch, tokenizer)
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % recipe.eval_every == 0 and step >= data.first_check:
            sampled = dev_accuracy(1.0)
            done = sampled >= recipe.target_sampled_accuracy or step + recipe.eval_every > recipe.max_steps
            greedy = dev_accuracy(0.0) if done or data.greedy_every_check else None
            history.append({"step": step, "loss": round(loss.item(), 4), "sampled": sampled, "greedy": greedy})
            log(f"warm start step {step}: loss {loss.item():.3f}, dev accuracy sampled {sampled:.2f}"
                + ("" if greedy is None else f" greedy {greedy:.2f}"))
            if done:
                break
    if history[-1]["sampled"] < recipe.target_sampled_accuracy:
        log(f"warm start: target {recipe.target_sampled_accuracy} not reached, keeping step {history[-1]['step']}")
    return history[-1], history


def build_demo(out_dir: str, recipe: DemoRecipe, log=print) -> None:
    torch.manual_seed(recipe.seed)
    splits = make_splits(recipe.num_train, recipe.num_eval, recipe.seed, recipe.digits)
    write_jsonl(splits.train, os.path.join(out_dir, "train.jsonl"))
    write_jsonl(splits.eval, os.path.join(out_dir, "eval.jsonl"))
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(recipe.spec, tokenizer, seed=recipe.seed)
    dev_pairs = splits.warm_start_pairs(recipe.num_dev, seed=recipe.seed + 1)
    train_pairs = splits.warm_start_pairs(recipe.max_steps * recipe.batch_size, seed=recipe.seed + 2)
    data = WarmStart(texts=[(prompt_text(a, b), completion_text(a, b)) for a, b in train_pairs],
                     dev_prompts=[tokenizer(prompt_text(a, b)).input_ids for a, b in dev_pairs],
                     dev_examples=[Example(messages=(), label=str(a + b)) for a, b in dev_pairs],
                     scorer=RewardScorer("boxed"), max_new_tokens=8)
    chosen, history = warm_start(model, tokenizer, recipe, data, log)
    save_tiny(model, tokenizer, os.path.join(out_dir, "model"))
    report = {"recipe": asdict(recipe), "chosen": chosen, "history": history}
    with open(os.path.join(out_dir, "report.json"), "w") as handle:
        json.dump(report, handle, indent=1)
