import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from coati.dataset.demo_task import make_splits
from coati.models.tiny import TinyModelSpec, build_char_tokenizer, build_tiny_model, save_tiny


def test_tokenizer_round_trips_text_and_keeps_boxed_whole():
    tokenizer = build_char_tokenizer()
    text = "def f(x):\n\treturn x % 2  # \\boxed{12}"
    ids = tokenizer(text).input_ids
    assert tokenizer.decode(ids) == text
    assert tokenizer.unk_token_id not in ids
    assert tokenizer.convert_ids_to_tokens(tokenizer("\\boxed{5}").input_ids) == ["\\boxed{", "5", "}"]


def test_models_are_deterministic_and_load_with_auto_classes(tmp_path):
    tokenizer = build_char_tokenizer()
    for arch in ("qwen2", "llama"):
        a = build_tiny_model(TinyModelSpec(arch=arch), tokenizer, seed=3)
        b = build_tiny_model(TinyModelSpec(arch=arch), tokenizer, seed=3)
        assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
        save_tiny(a, tokenizer, str(tmp_path / arch))
        loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / arch))
        assert type(loaded).__name__ == type(a).__name__
        ids = torch.tensor([tokenizer("12+34=").input_ids])
        torch.testing.assert_close(loaded(ids).logits, a(ids).logits)
        assert AutoTokenizer.from_pretrained(str(tmp_path / arch)).decode(ids[0]) == "12+34="


def test_demo_splits_are_disjoint_and_deterministic():
    a, b = make_splits(200, 50, seed=1), make_splits(200, 50, seed=1)
    assert a.train == b.train and a.eval == b.eval
    assert not set(a.train) & set(a.eval)
    assert not set(a.warm_start_pairs(500, seed=2)) & a.held_out


def test_demo_assets_are_partly_right(demo_assets):
    chosen = demo_assets.report["chosen"]
    assert 0.2 <= chosen["sampled"] <= 0.6, chosen
    assert AutoModelForCausalLM.from_pretrained(demo_assets.model_dir).num_parameters() > 100_000
