"""The embedded demo: a tiny Qwen2, its tokenizer, the addition task, and a short supervised warm start.

``ensure_demo_assets()`` returns the cached assets, building them when missing (about 20-40 s on 2 cores).
The warm start stops at the first checkpoint whose *sampled* accuracy on a dev split reaches
``target_sampled_accuracy``: accuracy jumps within ~100 steps, so the checkpoint is chosen by evaluation,
not by step count, and GRPO starts from a model that is partly right. Run ``python -m coati.models.demo``
to (re)build by hand.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass

import torch

from coati.dataset.demo_task import completion_text, make_splits, prompt_text, write_jsonl
from coati.dataset.jsonl import Example
from coati.distributed.evaluation import evaluate
from coati.distributed.inference_backend import SamplingParams, TransformersBackend
from coati.models.tiny import DEFAULT_CHARS, WORD_TOKENS, TinyModelSpec, build_char_tokenizer, build_tiny_model, save_tiny
from rewards.scorer import RewardScorer


@dataclass(frozen=True)
class DemoRecipe:
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
        """Names the cache directory: a change to the recipe or the tokenizer's alphabet rebuilds."""
        payload = json.dumps({"recipe": asdict(self), "chars": DEFAULT_CHARS, "words": WORD_TOKENS}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:10]


@dataclass(frozen=True)
class DemoAssets:
    model_dir: str
    train_path: str
    eval_path: str
    report: dict
    code_train_path: str = ""  # generated code tasks (PRIME format) for ``-rt code``
    code_eval_path: str = ""


def default_cache_dir() -> str:
    # An empty COATI_CACHE counts as unset (it would otherwise mean the current directory).
    return os.environ.get("COATI_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "coati")


def ensure_demo_assets(cache_dir: str | None = None, recipe: DemoRecipe = DemoRecipe(), log=print) -> DemoAssets:
    root = os.path.join(cache_dir or default_cache_dir(), f"demo-{recipe.fingerprint()}")
    if not os.path.isfile(os.path.join(root, "report.json")):
        os.makedirs(os.path.dirname(root), exist_ok=True)
        staging = tempfile.mkdtemp(prefix=".demo-building-", dir=os.path.dirname(root))
        try:
            build_demo(staging, recipe, log)
            shutil.rmtree(root, ignore_errors=True)  # an unfinished build never has report.json
            os.replace(staging, root)  # atomic: a killed build never looks finished
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    with open(os.path.join(root, "report.json")) as handle:
        report = json.load(handle)
    code_train, code_eval = (_ensure_code_split(root, name, n, recipe.seed + offset)
                             for name, n, offset in (("code_train", 256, 10), ("code_eval", 64, 11)))
    return DemoAssets(os.path.join(root, "model"), os.path.join(root, "train.jsonl"),
                      os.path.join(root, "eval.jsonl"), report, code_train, code_eval)


def ensure_base_model(cache_dir: str | None = None, recipe: DemoRecipe = DemoRecipe()) -> str:
    """The demo's tiny model *before* its warm start (random weights, the demo's tokenizer), saved once: the
    starting point of ``coati sft`` on the embedded task."""
    path = os.path.join(cache_dir or default_cache_dir(), f"base-{recipe.fingerprint()}")
    if not os.path.isfile(os.path.join(path, "config.json")):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        staging = tempfile.mkdtemp(prefix=".base-building-", dir=os.path.dirname(path))
        try:
            tokenizer = build_char_tokenizer()
            save_tiny(build_tiny_model(recipe.spec, tokenizer, seed=recipe.seed), tokenizer, staging)
            shutil.rmtree(path, ignore_errors=True)
            os.replace(staging, path)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return path


def _ensure_code_split(root: str, name: str, count: int, seed: int) -> str:
    from coati.dataset.code_task import write_code_dataset

    path = os.path.join(root, f"{name}.jsonl")
    if not os.path.isfile(path):
        write_code_dataset(path + ".tmp", count, seed)
        os.replace(path + ".tmp", path)
    return path


def _sft_batch(pairs, tokenizer):
    """Prompt + completion + EOS, right-padded; labels only on completion tokens (-100 elsewhere)."""
    rows, labels = [], []
    for a, b in pairs:
        prompt = tokenizer(prompt_text(a, b)).input_ids
        answer = tokenizer(completion_text(a, b)).input_ids + [tokenizer.eos_token_id]
        rows.append(prompt + answer)
        labels.append([-100] * len(prompt) + answer)
    width = max(map(len, rows))
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    label_ids = torch.tensor([r + [-100] * (width - len(r)) for r in labels])
    return input_ids, (input_ids != pad).long(), label_ids


def build_demo(out_dir: str, recipe: DemoRecipe, log=print) -> None:
    torch.manual_seed(recipe.seed)
    splits = make_splits(recipe.num_train, recipe.num_eval, recipe.seed, recipe.digits)
    write_jsonl(splits.train, os.path.join(out_dir, "train.jsonl"))
    write_jsonl(splits.eval, os.path.join(out_dir, "eval.jsonl"))
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(recipe.spec, tokenizer, seed=recipe.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.learning_rate)

    dev_pairs = splits.warm_start_pairs(recipe.num_dev, seed=recipe.seed + 1)
    dev_prompts = [tokenizer(prompt_text(a, b)).input_ids for a, b in dev_pairs]
    dev_examples = [Example(messages=(), gt_answer=str(a + b)) for a, b in dev_pairs]
    scorer = RewardScorer("boxed")
    train_pairs = splits.warm_start_pairs(recipe.max_steps * recipe.batch_size, seed=recipe.seed + 2)

    def dev_accuracy(temperature: float) -> float:
        backend = TransformersBackend(model, tokenizer, microbatch_size=256)
        params = SamplingParams(temperature=temperature, max_new_tokens=8)
        accuracy = evaluate(backend, dev_prompts, dev_examples, scorer, params).accuracy
        model.train()
        return accuracy

    history = []
    chosen = None
    model.train()
    for step in range(1, recipe.max_steps + 1):
        batch = train_pairs[(step - 1) * recipe.batch_size : step * recipe.batch_size]
        input_ids, attention_mask, labels = _sft_batch(batch, tokenizer)
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % recipe.eval_every == 0:
            sampled, greedy = dev_accuracy(1.0), dev_accuracy(0.0)
            history.append({"step": step, "loss": round(loss.item(), 4), "sampled": sampled, "greedy": greedy})
            log(f"warm start step {step}: loss {loss.item():.3f}, dev accuracy sampled {sampled:.2f} greedy {greedy:.2f}")
            if sampled >= recipe.target_sampled_accuracy:
                chosen = history[-1]
                break
    if chosen is None:
        chosen = history[-1]
        log(f"warm start: target {recipe.target_sampled_accuracy} not reached, keeping step {chosen['step']}")
    save_tiny(model, tokenizer, os.path.join(out_dir, "model"))
    report = {"recipe": asdict(recipe), "chosen": chosen, "history": history}
    with open(os.path.join(out_dir, "report.json"), "w") as handle:
        json.dump(report, handle, indent=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache-dir", default=None, help="default: $COATI_CACHE or ~/.cache/coati")
    parser.add_argument("--rebuild", action="store_true", help="delete the cached demo assets first")
    args = parser.parse_args()
    recipe = DemoRecipe()
    if args.rebuild:
        shutil.rmtree(os.path.join(args.cache_dir or default_cache_dir(), f"demo-{recipe.fingerprint()}"), True)
    assets = ensure_demo_assets(args.cache_dir, recipe)
    print(json.dumps({"model_dir": assets.model_dir, "train": assets.train_path, "eval": assets.eval_path,
                      "chosen": assets.report["chosen"]}, indent=1))


if __name__ == "__main__":
    main()
