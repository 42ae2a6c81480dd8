"""The tool demo (``rl_example.py --env tool_demo`` without a model): a tiny model learns to use a calculator.

Built once and cached beside the other demos (``tool-demo-<fingerprint>/`` in the demo cache) by
:func:`ensure_tool_demo_assets`: products of two 3-digit numbers (:mod:`coati.dataset.tool_demo_task`) split
into train and held-out eval rows, and a supervised warm start on other pairs in which only ``tool_share`` of
the episodes call the ``multiply`` tool; the rest answer in the model's head, which a 2-layer model cannot do.
So the warm-started model calls the tool about that often, and nearly only those episodes are right: GRPO has
one decision to learn (call the tool), and held-out accuracy follows the tool-use rate. The control
(``--env tool_demo_off``) plays the same episodes with a tool that always fails, and stays near zero.

The warm start trains on whole episodes with the tool's response masked out of the loss, as RL does, and
stops at the first checkpoint whose *sampled* dev accuracy (episodes played with the real environment)
reaches ``target_sampled_accuracy``.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import asdict, dataclass
from typing import ClassVar

import torch

from coati.config.sampling import SamplingParams
from coati.dataset.demo_task import make_splits
from coati.dataset.jsonl import Example
from coati.dataset.tool_demo_task import TOOL_WORD_TOKENS, episode_texts, prompt_text, write_rows
from coati.demo.assets import DemoAssets, demo_root, ensure_built
from coati.demo.math_demo import recipe_fingerprint
from coati.models.tiny import TinyModelSpec, build_char_tokenizer, build_tiny_model, save_tiny
from coati.rollout.env import MultiplyEnv
from coati.rollout.episode import EpisodeBudget
from coati.rollout.evaluation import evaluate_episodes
from coati.rollout.inference_backend import TransformersBackend


@dataclass(frozen=True)
class ToolDemoRecipe:
    cache_prefix: ClassVar[str] = "tool-demo"
    # Llama, as the code demo: a qwen2 directory's tokenizer reloads byte-level and would split the call tokens.
    spec: TinyModelSpec = TinyModelSpec(arch="llama")
    seed: int = 0
    num_train: int = 512
    num_eval: int = 256
    num_dev: int = 128
    tool_share: float = 0.3  # of warm-start episodes that call the tool: what GRPO starts from
    batch_size: int = 64
    learning_rate: float = 1e-3
    max_steps: int = 600
    eval_every: int = 25
    target_sampled_accuracy: float = 0.2  # at most ~tool_share: only tool episodes are right
    max_new_tokens: int = 12  # per turn: a call is 9 tokens, an answer at most 9 with EOS

    def fingerprint(self) -> str:
        return recipe_fingerprint(self, TOOL_WORD_TOKENS)


def ensure_tool_demo_assets(cache_dir: str | None = None, recipe: ToolDemoRecipe = ToolDemoRecipe(),
                            log=print) -> DemoAssets:
    """The cached tool demo (model, train.jsonl, eval.jsonl, report), built when missing."""
    return ensure_built(demo_root(cache_dir, recipe),
                        lambda out_dir: build_tool_demo(out_dir, recipe, log))


def episode_batch(pairs_and_tool: list[tuple[int, int, bool]], tokenizer):
    """Prompt + episode response + EOS, right-padded; labels only on the model's own tokens (the tool's
    response and the prompt are -100), each piece tokenised on its own as an episode appends it."""
    encode = lambda text: tokenizer(text, add_special_tokens=False).input_ids  # noqa: E731
    rows, labels = [], []
    for a, b, use_tool in pairs_and_tool:
        row = encode(prompt_text(a, b))
        label = [-100] * len(row)
        for text, by_model in episode_texts(a, b, use_tool):
            ids = encode(text)
            row, label = row + ids, label + (ids if by_model else [-100] * len(ids))
        rows.append(row + [tokenizer.eos_token_id])
        labels.append(label + [tokenizer.eos_token_id])
    width, pad = max(map(len, rows)), tokenizer.pad_token_id
    input_ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    label_ids = torch.tensor([r + [-100] * (width - len(r)) for r in labels])
    return input_ids, (input_ids != pad).long(), label_ids


def dev_check(model, tokenizer, dev_pairs, recipe: ToolDemoRecipe, temperature: float) -> dict:
    """Accuracy and tool-use rate of dev episodes played with the real environment."""
    backend = TransformersBackend(model, tokenizer, prompts_per_call=256)
    batch = [(Example(messages=(), label=str(a * b)), prompt_text(a, b), tokenizer(prompt_text(a, b)).input_ids)
             for a, b in dev_pairs]
    params = SamplingParams(temperature=temperature, max_new_tokens=recipe.max_new_tokens)
    result = evaluate_episodes(backend, MultiplyEnv, batch, params, EpisodeBudget(max_turns=4, max_tokens=64))
    model.train()
    return {"accuracy": result.accuracy, "tool_use_rate": result.tool_use_rate}


def tool_warm_start(model, tokenizer, recipe: ToolDemoRecipe, train_pairs, dev_pairs, log=print):
    """Supervised steps on warm-start episodes until the sampled dev accuracy reaches the target; (chosen, history)."""
    rng = random.Random(recipe.seed + 3)
    episodes = [(a, b, rng.random() < recipe.tool_share) for a, b in train_pairs]
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.learning_rate)
    history = []
    model.train()
    for step in range(1, recipe.max_steps + 1):
        input_ids, attention_mask, labels = episode_batch(
            episodes[(step - 1) * recipe.batch_size : step * recipe.batch_size], tokenizer)
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % recipe.eval_every:
            continue
        sampled = dev_check(model, tokenizer, dev_pairs, recipe, 1.0)
        done = sampled["accuracy"] >= recipe.target_sampled_accuracy or step + recipe.eval_every > recipe.max_steps
        greedy = dev_check(model, tokenizer, dev_pairs, recipe, 0.0) if done else None
        history.append({"step": step, "loss": round(loss.item(), 4), "sampled": sampled, "greedy": greedy})
        log(f"warm start step {step}: loss {loss.item():.3f}, dev sampled accuracy {sampled['accuracy']:.2f} "
            f"tool use {sampled['tool_use_rate']:.2f}")
        if done:
            break
    return history[-1], history


def build_tool_demo(out_dir: str, recipe: ToolDemoRecipe, log=print) -> None:
    torch.manual_seed(recipe.seed)
    splits = make_splits(recipe.num_train, recipe.num_eval, recipe.seed, digits=3)
    write_rows(splits.train, os.path.join(out_dir, "train.jsonl"))
    write_rows(splits.eval, os.path.join(out_dir, "eval.jsonl"))
    tokenizer = build_char_tokenizer(word_tokens=TOOL_WORD_TOKENS)
    model = build_tiny_model(recipe.spec, tokenizer, seed=recipe.seed)
    dev_pairs = splits.warm_start_pairs(recipe.num_dev, seed=recipe.seed + 1)
    train_pairs = splits.warm_start_pairs(recipe.max_steps * recipe.batch_size, seed=recipe.seed + 2)
    chosen, history = tool_warm_start(model, tokenizer, recipe, train_pairs, dev_pairs, log)
    save_tiny(model, tokenizer, os.path.join(out_dir, "model"))
    with open(os.path.join(out_dir, "report.json"), "w") as handle:
        json.dump({"recipe": asdict(recipe), "chosen": chosen, "history": history}, handle, indent=1)
