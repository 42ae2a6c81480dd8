"""Tiny causal LMs and a character-level tokenizer built from code, so nothing is ever downloaded.

Both are saved with ``save_pretrained``: ``AutoModelForCausalLM`` / ``AutoTokenizer.from_pretrained(dir)``
load them like any hub model, so every code path (producers, trainers, vLLM) treats them as real models.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel, PreTrainedTokenizerFast, Qwen2Config
from transformers import Qwen2ForCausalLM

SPECIAL_TOKENS = ("<pad>", "<eos>", "<unk>")
# Multi-character tokens come first in the split pattern so they are never cut into characters.
WORD_TOKENS = ("\\boxed{",)
# Digits first (the demo's hot tokens get small ids), then the rest of printable ASCII, newline and tab.
DEFAULT_CHARS = "0123456789+=" + "".join(c for c in map(chr, range(32, 127)) if c not in "0123456789+=") + "\n\t"


def build_char_tokenizer(chars: str = DEFAULT_CHARS, word_tokens: tuple[str, ...] = WORD_TOKENS):
    """A tokenizer with one token per character (plus ``word_tokens``); unknown characters map to <unk>."""
    vocab: dict[str, int] = {}
    for token in (*SPECIAL_TOKENS, *word_tokens, *chars):
        vocab.setdefault(token, len(vocab))
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    any_char = r"[\s\S]"  # Oniguruma's "." skips newlines
    pattern = "|".join([*(_escape(w) for w in word_tokens), any_char])
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def _escape(text: str) -> str:
    """re.escape for the tokenizers library's Oniguruma regex syntax."""
    return "".join("\\" + c if c in r"\.^$|?*+()[]{}" else c for c in text)


@dataclass(frozen=True)
class TinyModelSpec:
    arch: str = "qwen2"  # qwen2 | llama
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 512
    max_positions: int = 1024
    tie_embeddings: bool = True


def build_tiny_model(spec: TinyModelSpec, tokenizer, seed: int = 0) -> PreTrainedModel:
    """A randomly initialised causal LM; deterministic for a given spec, vocabulary and seed."""
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_positions,
        tie_word_embeddings=spec.tie_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        torch_dtype="float32",
    )
    if spec.arch == "qwen2":
        config, cls = Qwen2Config(**common), Qwen2ForCausalLM
    elif spec.arch == "llama":
        config, cls = LlamaConfig(**common), LlamaForCausalLM
    else:
        raise ValueError(f"unknown tiny model architecture {spec.arch!r}; use 'qwen2' or 'llama'")
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = cls(config)
    finally:
        torch.random.set_rng_state(generator_state)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = None
    return model


def save_tiny(model: PreTrainedModel, tokenizer, path: str) -> None:
    """Saved without transformers' "Writing model shards" bar: one shard of a tiny model tells a user nothing,
    and the bar would sit between the demo's own lines (or before a one-line error on a first run)."""
    from transformers.utils import logging as transformers_logging

    was_enabled = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()
    try:
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
    finally:
        if was_enabled:
            transformers_logging.enable_progress_bar()
