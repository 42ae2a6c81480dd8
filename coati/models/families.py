"""Decoder model families: what each one's head and attention need from the trainer, and tiny random-weight models
of each that keep the family's quirks (the conformance matrix in tests/models/test_family_conformance.py,
docs/models.md).

One ``Family`` row per HF ``model_type``. What the trainer reads of a row:

- ``head_shaping`` / ``shape_logits``: what the family's HF head does to ``lm_head``'s output (Granite divides by
  ``logits_scaling``, Cohere multiplies by ``logit_scale``, Gemma2/3 soft-cap with ``final_logit_softcapping``).
  Every path that computes the LM head itself (pipeline stages: coati/plugins/torch_pipeline.py,
  coati/plugins/colossal_policies.py) applies it through ``shape_logits``, so no path trains a different model than
  the one vLLM serves. ``input_embeddings`` is the same for the embedding side (Granite's ``embedding_multiplier``;
  Gemma's scale lives in its embedding module).
- ``trainer_attention``: the attention implementation the trainer must load the model with. Gemma2's attention
  soft-capping is honoured by HF eager but swallowed by HF's default sdpa, while vLLM applies it: such a family
  trains under eager (``load_options``), never silently under sdpa.

The tiny builders (``build_family_model``) construct each config class directly, shrunk, with what makes the family
itself kept and made to bite: tied or untied head as the family ships, soft-caps small against random logits, QK
norm, sliding windows shorter than a test sequence, Granite's four multipliers away from 1.0, pad == eos where the
family ships it, head_dim 32 (vLLM's CPU attention serves 32, 64, 80, ...).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

WINDOW = 8  # sliding windows of the tiny models: shorter than the tests' sequences
HEAD_DIM = 32  # in vLLM CPU attention's supported head sizes


def _one(config) -> float:
    return 1.0


@dataclass(frozen=True)
class Family:
    model_type: str
    architecture: str  # the HF causal-LM class, which config.json's ``architectures`` names to vLLM
    config_class: str
    quirks: str  # what the family exercises (docs/models.md)
    tiny: dict = field(default_factory=dict)  # config fields of the tiny model beyond the common ones
    # the factor the HF head multiplies lm_head's output by (before any soft-cap)
    logit_factor: Callable[[object], float] = _one
    # the attention implementation the trainer loads the family with (None: transformers' default, sdpa)
    trainer_attention: str | None = None
    pad_is_eos: bool = False  # the family ships pad == eos (masks must not be built from ``ids != pad``)
    # inference engines (coati/registry/backends.py names) that fail on this family's LoRA adapter tensors, and why
    adapters_fail_on: tuple[str, ...] = ()
    adapters_failure: str = ""


FAMILIES: dict[str, Family] = {row.model_type: row for row in (
    Family("llama", "LlamaForCausalLM", "LlamaConfig", "baseline: RMSNorm, SwiGLU, RoPE; untied head",
           {"tie_word_embeddings": False, "attention_bias": True}),
    Family("qwen2", "Qwen2ForCausalLM", "Qwen2Config", "q/k/v bias always on; untied head",
           {"tie_word_embeddings": False}),
    Family("qwen3", "Qwen3ForCausalLM", "Qwen3Config", "per-head q_norm/k_norm; tied head (as Qwen3-0.6B-4B ship)",
           {"tie_word_embeddings": True}),
    Family("mistral", "MistralForCausalLM", "MistralConfig", "sliding window on every layer (no layer_types)",
           {"tie_word_embeddings": False, "sliding_window": WINDOW}),
    Family("gemma2", "Gemma2ForCausalLM", "Gemma2Config",
           "final-logit and attention soft-capping; alternating sliding layers; embeddings x sqrt(hidden); "
           "(1+w) RMSNorm; query_pre_attn_scalar; tied head",
           {"tie_word_embeddings": True, "sliding_window": WINDOW, "final_logit_softcapping": 2.0,
            "attn_logit_softcapping": 1.0, "query_pre_attn_scalar": 24, "hidden_activation": "gelu_pytorch_tanh"},
           trainer_attention="eager"),
    Family("gemma3_text", "Gemma3ForCausalLM", "Gemma3TextConfig",
           "qk-norm; sliding and global layers with their own RoPE; embeddings x sqrt(hidden); "
           "query_pre_attn_scalar; tied head",
           {"tie_word_embeddings": True, "sliding_window": WINDOW, "query_pre_attn_scalar": 24,
            "layer_types": ["sliding_attention", "full_attention"]}),
    Family("phi3", "Phi3ForCausalLM", "Phi3Config", "fused qkv_proj and gate_up_proj in HF; pad == eos",
           {"tie_word_embeddings": False}, pad_is_eos=True),
    Family("olmo2", "Olmo2ForCausalLM", "Olmo2Config",
           "q/k norm over the whole projection (before the head split); post-norms only", {"tie_word_embeddings": False}),
    Family("granite", "GraniteForCausalLM", "GraniteConfig",
           "muP multipliers: embeddings, attention scale, residual branches, logits divided by logits_scaling; "
           "pad == eos (Granite 3.1 tokenizers)",
           {"tie_word_embeddings": False, "embedding_multiplier": 3.0, "attention_multiplier": 0.25,
            "residual_multiplier": 0.5, "logits_scaling": 0.5},
           logit_factor=lambda config: 1.0 / config.logits_scaling, pad_is_eos=True),
    Family("glm4", "Glm4ForCausalLM", "Glm4Config",
           "attention bias; RoPE on half the head, interleaved; post-attention and post-MLP norms; fused gate_up_proj",
           {"tie_word_embeddings": False, "partial_rotary_factor": 0.5},
           adapters_fail_on=("vllm",),
           adapters_failure="vLLM 0.32's LoRA expects separate gate/up adapters where HF's Glm4 has one fused "
                            "gate_up_proj (IndexError in the engine)"),
    Family("cohere", "CohereForCausalLM", "CohereConfig",
           "logits x logit_scale; LayerNorm; parallel attention and MLP; interleaved RoPE; tied head",
           {"tie_word_embeddings": True, "logit_scale": 0.5, "use_qk_norm": False},
           logit_factor=lambda config: config.logit_scale),
)}


def model_type_of(path: str) -> str | None:
    """The ``model_type`` of a local model directory's config.json (torch-free; None when there is none)."""
    import json
    import os

    try:
        with open(os.path.join(path, "config.json")) as handle:
            return json.load(handle).get("model_type")
    except (OSError, ValueError):
        return None


def adapters_refused(model_type: str | None, engine: str) -> str | None:
    """Why ``engine`` cannot take LoRA adapter tensors of a ``model_type`` model (the conformance matrix's ``lora``
    column), None when it can."""
    family = FAMILIES.get(model_type)
    if family is not None and engine in family.adapters_fail_on:
        return f"{model_type} models: {family.adapters_failure}"
    return None


def family_of(config) -> Family | None:
    """The row of ``config``'s model type (an HF config), None for a family not in the table."""
    return FAMILIES.get(getattr(config, "model_type", None))


# -- the head and the embeddings, for every path that computes them itself ------------------------------------
def head_shaping(config) -> tuple[float, float | None]:
    """(factor, soft-cap) of ``config``'s HF head: logits = cap * tanh(factor * lm_head(h) / cap) (no tanh when the
    cap is None). Families outside the table: their config's soft-cap, factor 1."""
    family = family_of(config)
    factor = family.logit_factor(config) if family is not None else 1.0
    return float(factor), getattr(config, "final_logit_softcapping", None)


def shape_logits(logits, config):
    """``lm_head``'s output as the family's HF head returns it (``head_shaping``)."""
    import torch

    factor, cap = head_shaping(config)
    if factor != 1.0:
        logits = logits * factor
    if cap is not None:
        logits = torch.tanh(logits / cap) * cap
    return logits


def input_embeddings(embed_tokens, config, input_ids):
    """The decoder's input hidden states as the family's HF model forward builds them from ``embed_tokens``
    (Granite multiplies by ``embedding_multiplier`` in the model's forward, outside the embedding module)."""
    hidden = embed_tokens(input_ids)
    multiplier = getattr(config, "embedding_multiplier", None) if getattr(config, "model_type", None) == "granite" \
        else None
    return hidden if multiplier in (None, 1.0) else hidden * multiplier


def layer_type(config, index: int) -> str:
    """Whether decoder layer ``index`` attends within a sliding window (``"sliding_attention"``) or over the whole
    prefix (``"full_attention"``), as the family's HF model forward decides it: ``layer_types`` where the config has
    them (Gemma2/3, Qwen2/3: all full unless ``use_sliding_window``), else every layer slides when the config sets a
    ``sliding_window`` (Mistral, Phi3)."""
    types = getattr(config, "layer_types", None)
    if types:
        return types[index]
    return "sliding_attention" if getattr(config, "sliding_window", None) else "full_attention"


def decoder_stage(model, layers: dict[int, object], inputs, attention_mask, first: bool, last: bool, lm_head=None):
    """Decoder layers ``layers`` (index -> HF layer) of an HF causal LM's inner ``model`` (``.embed_tokens`` on the
    first stage, ``.norm`` on the last, ``.rotary_emb`` and ``.config``) on ``inputs`` (token ids on the first stage,
    hidden states after): the next stage's hidden states, or on the last stage the logits as the family's HF head
    returns them. Each layer gets the mask of its type (``layer_type``) and its type's rotary embeddings (Gemma3 keeps
    one per type); the input embeddings and head go through ``input_embeddings`` and ``shape_logits``, so a pipeline
    stage computes the model vLLM serves. Right-padded rows, positions from 0, no cache (a training forward)."""
    import inspect

    import torch
    from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

    config = model.config
    hidden = input_embeddings(model.embed_tokens, config, inputs) if first else inputs
    position_ids = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
    kinds = {index: layer_type(config, index) for index in layers}
    mask_of = {"full_attention": create_causal_mask, "sliding_attention": create_sliding_window_causal_mask}
    masks = {kind: mask_of[kind](config=config, inputs_embeds=hidden, attention_mask=attention_mask,
                                 past_key_values=None, position_ids=position_ids) for kind in set(kinds.values())}
    by_type = "layer_type" in inspect.signature(model.rotary_emb.forward).parameters
    rotary = {kind: (model.rotary_emb(hidden, position_ids, kind) if by_type else model.rotary_emb(hidden, position_ids))
              for kind in set(kinds.values())}
    for index, layer in layers.items():
        hidden = layer(hidden, attention_mask=masks[kinds[index]], position_ids=position_ids,
                       position_embeddings=rotary[kinds[index]])
    if not last:
        return hidden
    return shape_logits(lm_head(model.norm(hidden)), config)


def trainer_attention(config) -> str | None:
    """The attention implementation the trainer loads ``config``'s model with: the family row's, else eager for
    any config that soft-caps attention scores (HF's sdpa drops the cap, vLLM applies it), else None (the default)."""
    family = family_of(config)
    if family is not None and family.trainer_attention:
        return family.trainer_attention
    return "eager" if getattr(config, "attn_logit_softcapping", None) else None


def load_options(config) -> dict:
    """``from_pretrained`` keywords every trainer-side load of ``config``'s model takes (its attention
    implementation, where the default would train a different model than the engine serves)."""
    attention = trainer_attention(config)
    return {"attn_implementation": attention} if attention else {}


def load_causal_lm(path: str, dtype=None, **kwargs):
    """``AutoModelForCausalLM.from_pretrained(path)`` with the family's ``load_options``."""
    from transformers import AutoConfig, AutoModelForCausalLM

    options = load_options(AutoConfig.from_pretrained(path))
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **{**options, **kwargs})


# -- tiny models -----------------------------------------------------------------------------------------------
def tiny_config(model_type: str, tokenizer, num_layers: int = 2):
    """The tiny config of ``model_type``: 4 query heads over 2 key/value heads of ``HEAD_DIM`` (tensor parallelism
    up to 2), hidden 128, the
    tokenizer's vocabulary and special ids (pad = eos where the family ships it), fp32, plus the row's fields."""
    import transformers

    family = FAMILIES[model_type]
    pad = tokenizer.eos_token_id if family.pad_is_eos else tokenizer.pad_token_id
    common = dict(vocab_size=len(tokenizer), hidden_size=4 * HEAD_DIM, intermediate_size=256,
                  num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2, head_dim=HEAD_DIM, max_position_embeddings=256,
                  pad_token_id=pad, eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
                  initializer_range=0.1, torch_dtype="float32")
    config = getattr(transformers, family.config_class)(**{**common, **family.tiny})
    config.architectures = [family.architecture]
    return config


def tiny_tokenizer(model_type: str):
    """The char tokenizer (coati.models.tiny), its pad token the eos where the family ships pad == eos."""
    from coati.models.tiny import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    if FAMILIES[model_type].pad_is_eos:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def build_family_model(model_type: str, tokenizer, seed: int = 0):
    """A random-weight tiny model of ``model_type`` (deterministic per seed; the caller's RNG left as it was)."""
    import torch
    import transformers

    config = tiny_config(model_type, tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = getattr(transformers, FAMILIES[model_type].architecture)(config)
    generation = model.generation_config
    generation.pad_token_id, generation.eos_token_id, generation.bos_token_id = \
        config.pad_token_id, tokenizer.eos_token_id, None
    return model


def save_family_model(model_type: str, path: str, seed: int = 0) -> str:
    """The tiny model of ``model_type`` and its tokenizer saved at ``path`` (an HF directory vLLM loads)."""
    from coati.models.tiny import save_tiny

    tokenizer = tiny_tokenizer(model_type)
    save_tiny(build_family_model(model_type, tokenizer, seed), tokenizer, path)
    return path
