"""A real-size model built here: Qwen2 architecture at Qwen2.5-0.5B's shape, a byte-level BPE tokenizer trained
locally and a ChatML chat template, written as an HF directory. Nothing is downloaded; weights are random.

    python -m coati.models.scale OUT_DIR [--tiny]

The tokenizer learns its merges from GSM8K-shaped word problems written by ``word_problems`` and from the
project's own .py/.md files. The embedding has ``QWEN25_05B.vocab_size`` rows (Qwen2.5's padded vocabulary)
whatever the learned vocabulary's size, so the parameter count and the logits' width are the real model's.
The model is built once in memory and written in shards of ``SHARD_SIZE``: no second copy is ever made.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
SHARD_SIZE = "400MB"  # safetensors builds each shard's bytes in memory before writing it
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@dataclass(frozen=True)
class ScaleShape:
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int  # embedding rows (>= the tokenizer's vocabulary)
    bpe_vocab: int  # merges the tokenizer trainer aims for
    max_positions: int = 32768
    rope_theta: float = 1000000.0
    tie_embeddings: bool = True


QWEN25_05B = ScaleShape(hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2, intermediate_size=4864,
                        vocab_size=151936, bpe_vocab=32000)
TINY = replace(QWEN25_05B, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128,
               vocab_size=2048, bpe_vocab=1024, max_positions=2048)


def word_problems(count: int, seed: int = 0) -> list[dict]:
    """GSM8K-shaped rows: a multi-step word problem (``question``) and a worked answer ending ``#### N``."""
    rng = random.Random(seed)
    names = ("Natalia", "Weng", "Betty", "Julie", "James", "Mark", "Albert", "Ken", "Alexis", "Tina")
    things = ("clips", "apples", "pages", "cookies", "marbles", "stickers", "books", "eggs")
    rows = []
    for _ in range(count):
        name, thing = rng.choice(names), rng.choice(things)
        a, b, price = rng.randint(2, 60), rng.randint(2, 9), rng.randint(1, 12)
        total = a + a * b
        question = (f"{name} sold {a} {thing} on Monday, and {b} times as many on Tuesday. Each of the {thing} "
                    f"costs ${price}. How many dollars did {name} earn in the two days?")
        answer = (f"On Tuesday {name} sold {a} * {b} = <<{a}*{b}={a * b}>>{a * b} {thing}.\n"
                  f"In all {name} sold {a} + {a * b} = <<{a}+{a * b}={total}>>{total} {thing}.\n"
                  f"That earns {total} * {price} = <<{total}*{price}={total * price}>>{total * price} dollars.\n"
                  f"#### {total * price}")
        rows.append({"question": question, "answer": answer})
    return rows


def corpus(root: str | None = None, problems: int = 4000, max_files: int | None = None):
    """Text to learn merges from: word problems, then the project's .py and .md files (sorted: reproducible)."""
    for row in word_problems(problems):
        yield row["question"] + "\n" + row["answer"]
    root_path = Path(root or Path(__file__).resolve().parents[2])
    files = sorted(p for ext in ("*.py", "*.md") for p in root_path.rglob(ext)
                   if not any(part.startswith(".") or part in ("node_modules", "build") for part in p.parts))
    for path in files[:max_files]:
        try:
            yield path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue


def train_tokenizer(texts, vocab_size: int):
    """A byte-level BPE tokenizer (Qwen2's pre-tokenisation and byte fallback) with ChatML special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=["<|im_start|>"])
    fast.chat_template = CHAT_TEMPLATE
    return fast


def model_config(shape: ScaleShape, tokenizer):
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=shape.vocab_size, hidden_size=shape.hidden_size,
                       intermediate_size=shape.intermediate_size, num_hidden_layers=shape.num_layers,
                       num_attention_heads=shape.num_heads, num_key_value_heads=shape.num_kv_heads,
                       max_position_embeddings=shape.max_positions, rope_theta=shape.rope_theta,
                       tie_word_embeddings=shape.tie_embeddings, pad_token_id=tokenizer.pad_token_id,
                       eos_token_id=tokenizer.eos_token_id, bos_token_id=None, torch_dtype="float32")


def build(out_dir: str, shape: ScaleShape = QWEN25_05B, seed: int = 0, corpus_root: str | None = None,
          max_files: int | None = None, log=print) -> dict:
    """Write the tokenizer and a randomly initialised model to ``out_dir``; seconds per stage and the size."""
    import torch
    from transformers import Qwen2ForCausalLM
    from transformers.utils import logging as transformers_logging

    times = {}
    start = time.perf_counter()
    tokenizer = train_tokenizer(corpus(corpus_root, max_files=max_files), shape.bpe_vocab)
    if len(tokenizer) > shape.vocab_size:
        raise ValueError(f"the tokenizer learned {len(tokenizer)} tokens, more than the {shape.vocab_size} "
                         f"embedding rows: lower bpe_vocab")
    times["tokenizer_s"] = time.perf_counter() - start
    start = time.perf_counter()
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(model_config(shape, tokenizer))
    for key in ("pad_token_id", "eos_token_id"):
        setattr(model.generation_config, key, getattr(tokenizer, key))
    model.generation_config.bos_token_id = None
    times["init_s"] = time.perf_counter() - start
    start = time.perf_counter()
    transformers_logging.disable_progress_bar()
    model.save_pretrained(out_dir, max_shard_size=SHARD_SIZE)
    tokenizer.save_pretrained(out_dir)
    times["save_s"] = time.perf_counter() - start
    params = sum(p.numel() for p in model.parameters())
    log(f"wrote {out_dir}: {params / 1e9:.3f}B parameters, tokenizer {len(tokenizer)} tokens "
        f"(embedding {shape.vocab_size} rows); " + ", ".join(f"{k} {v:.1f}" for k, v in times.items()))
    return {"params": params, "tokenizer_tokens": len(tokenizer), **times}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m coati.models.scale", description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--tiny", action="store_true", help="the same build at a tiny shape (tests)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if os.path.exists(os.path.join(args.out_dir, "config.json")):
        sys.exit(f"{args.out_dir} already holds a model: choose an empty directory")
    build(args.out_dir, TINY if args.tiny else QWEN25_05B, seed=args.seed)


if __name__ == "__main__":
    main()
