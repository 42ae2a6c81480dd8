"""The real-size model's builder, run at a tiny shape (the same code path: tokenizer training, config, shards)."""

import json

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from coati.models.scale import QWEN25_05B, TINY, build, model_config, word_problems


def test_tiny_build_loads_with_auto_classes_and_applies_the_chat_template(tmp_path):
    out = str(tmp_path / "model")
    info = build(out, TINY, max_files=40, log=lambda message: None)
    tokenizer = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert model.get_input_embeddings().weight.shape == (TINY.vocab_size, TINY.hidden_size)
    assert info["params"] == sum(p.numel() for p in model.parameters())
    assert info["tokenizer_tokens"] == len(tokenizer) <= TINY.vocab_size

    text = "Natalia sold 48 clips. #### 72"
    ids = tokenizer(text).input_ids
    assert tokenizer.decode(ids) == text  # byte-level: any text round-trips
    assert len(ids) < len(text) // 2  # merges were learned: a word is not a run of characters
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "2+2?"}], tokenize=False,
                                         add_generation_prompt=True)
    assert chat == "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), TINY.vocab_size)


def test_full_shape_has_qwen25_05b_dimensions_and_parameter_count():
    class Tok:
        pad_token_id, eos_token_id = 0, 2

    config = model_config(QWEN25_05B, Tok())
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads,
            config.num_key_value_heads, config.intermediate_size) == (24, 896, 14, 2, 4864)
    head_dim = 896 // 14
    per_layer = (896 * 896 + 896) + 2 * (896 * 2 * head_dim + 2 * head_dim) + 896 * 896 + 3 * 896 * 4864 + 2 * 896
    total = 151936 * 896 + 24 * per_layer + 896  # tied embeddings: one matrix
    assert total == 494_032_768  # Qwen2.5-0.5B's published count
    assert config.tie_word_embeddings


def test_word_problems_are_gsm8k_shaped_and_correct():
    rows = word_problems(20, seed=1)
    assert rows == word_problems(20, seed=1)
    for row in rows:
        steps = row["answer"].split("\n")
        assert steps[-1].startswith("#### ")
        final = int(steps[-1][5:])
        product = steps[-2].split("= <<")[1].split("=")[1].split(">>")[0]
        assert int(product) == final
        json.dumps(row)
