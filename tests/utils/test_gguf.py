"""GGUF files as -m: which file a path names (one line when it is ambiguous), the conversion of the real
SmolLM2-135M-Instruct file into an HF directory that equals the GGUF model, and the cache that converts once."""

from __future__ import annotations

import json
import os

import pytest

from coati.utils.gguf import GGUFError, MARKER, converted_dir, gguf_file_of, hf_dir_from_gguf
from coati.utils.model_source import local_model_dir, model_display_name


def _touch(path, data: bytes = b"GGUF") -> str:
    with open(path, "wb") as handle:
        handle.write(data)
    return str(path)


def test_a_gguf_path_names_one_file_and_several_need_gguf_file(tmp_path):
    one = _touch(tmp_path / "m.Q4_1.gguf")
    assert gguf_file_of(one) == one
    assert gguf_file_of(str(tmp_path)) == one  # a directory with one GGUF file
    second = _touch(tmp_path / "m.Q8_0.gguf")
    with pytest.raises(GGUFError) as err:
        gguf_file_of(str(tmp_path))
    assert str(err.value) == (f"-m/--model {tmp_path} holds 2 GGUF files (m.Q4_1.gguf, m.Q8_0.gguf): pick one with "
                              "--gguf-file NAME, or pass the file itself as -m/--model")
    assert gguf_file_of(str(tmp_path), "m.Q8_0.gguf") == second
    with pytest.raises(GGUFError, match=r"^--gguf-file m.F16.gguf: not in .* \(it holds m.Q4_1.gguf, m.Q8_0.gguf\)$"):
        gguf_file_of(str(tmp_path), "m.F16.gguf")


def test_an_hf_directory_is_not_gguf_and_gguf_file_without_gguf_is_refused(tmp_path):
    _touch(tmp_path / "config.json", b"{}")
    assert gguf_file_of(str(tmp_path)) is None
    assert local_model_dir(str(tmp_path)) == str(tmp_path)
    with pytest.raises(GGUFError, match=r"^--gguf-file x.gguf: not in .* \(it holds no .gguf file\)$"):
        local_model_dir(str(tmp_path), gguf_file="x.gguf")
    assert model_display_name("/models/SmolLM2-135M-Instruct.Q4_1.gguf") == "SmolLM2-135M-Instruct.Q4_1"


def test_the_cache_entry_follows_the_file(tmp_path):
    path = _touch(tmp_path / "m.gguf", b"GGUF" + bytes(100))
    first = converted_dir(path, str(tmp_path / "cache"))
    assert converted_dir(path, str(tmp_path / "cache")) == first
    _touch(path, b"GGUF" + bytes(101))  # another file under the same name converts again
    assert converted_dir(path, str(tmp_path / "cache")) != first


def test_a_file_transformers_cannot_read_is_one_line(tmp_path):
    path = _touch(tmp_path / "broken.gguf", b"not a gguf file at all")
    with pytest.raises(GGUFError) as err:
        hf_dir_from_gguf(path, cache_dir=str(tmp_path / "cache"), log=lambda line: None)
    assert "\n" not in str(err.value)
    assert str(err.value).startswith(f"{path}: transformers cannot read this GGUF file (")
    assert not os.path.exists(converted_dir(path, str(tmp_path / "cache")))  # nothing half-built left


def test_a_conversion_parses_each_file_once_and_leaves_gguf_as_it_was(tmp_path):
    """transformers parses a GGUF file three times in one conversion (config, tokenizer, weights) and builds a
    tensor-name map per module: inside ``_parsed_once`` each is built once, and gguf's own functions are back
    after it (also after an error)."""
    import gguf
    import numpy as np

    from coati.utils.gguf import _parsed_once

    path = str(tmp_path / "tiny.gguf")
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(2)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    with _parsed_once():
        first = gguf.GGUFReader(path)
        assert gguf.GGUFReader(os.path.join(str(tmp_path), ".", "tiny.gguf")) is first  # the same file, once
        assert first.fields["llama.block_count"].contents() == 2
        llama = gguf.MODEL_ARCH.LLAMA
        assert gguf.get_tensor_name_map(llama, 2) is gguf.get_tensor_name_map(llama, 2)
        assert gguf.get_tensor_name_map(llama, 3) is not gguf.get_tensor_name_map(llama, 2)
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == (reader, name_map)
    with pytest.raises(RuntimeError), _parsed_once():
        raise RuntimeError("a conversion that fails")
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == (reader, name_map)
    assert gguf.GGUFReader(path) is not first


@pytest.mark.e2e  # a real model's dequantization and two loads: ~40 s of a core
def test_the_shipped_smollm2_converts_to_an_hf_directory_equal_to_the_gguf_model(smollm2_gguf, tmp_path, monkeypatch):
    """The conversion into a fresh cache, keeping the model transformers read from the GGUF file (a spy on its
    loader: the one dequantization this costs, about 20 s on a CI core, is not done twice), against what the
    directory it wrote loads as: the same logits, to the bit."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    read_from_gguf, load = [], AutoModelForCausalLM.from_pretrained

    def spy(*args, **kwargs):
        model = load(*args, **kwargs)
        if kwargs.get("gguf_file"):
            read_from_gguf.append(model)
        return model

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", spy)
    smollm2_dir = hf_dir_from_gguf(smollm2_gguf, cache_dir=str(tmp_path), log=lambda message: None)
    monkeypatch.undo()
    (original,) = read_from_gguf
    with open(os.path.join(smollm2_dir, MARKER)) as handle:
        assert json.load(handle)["architecture"] == "LlamaForCausalLM"
    converted = AutoModelForCausalLM.from_pretrained(smollm2_dir)
    assert getattr(converted.config, "quantization_config", None) is None
    assert converted.config.tie_word_embeddings
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Calculate 2 + 3."}], tokenize=False,
                                         add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n"), text  # the model's own chat template travelled
    from coati.rollout.generation import plain_text_start
    from coati.utils.gguf import _gguf_adds_bos

    # the file's tokenizer.ggml.add_bos_token travels too (False here; a base Gemma's True gives its BOS)
    assert _gguf_adds_bos(smollm2_gguf) is False and plain_text_start(tokenizer) == []
    ids = tokenizer(text, return_tensors="pt").input_ids
    with torch.no_grad():
        assert torch.equal(converted(ids).logits, original(ids).logits)
