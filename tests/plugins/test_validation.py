"""Start-up checks of trainer layouts: one clear ValueError line each; make_plugin names and defaults."""

from __future__ import annotations

import pytest
from transformers import LlamaConfig, Qwen2Config

from coati.plugins import PLUGINS, make_plugin
from coati.plugins.torch_single import SingleProcessPlugin
from coati.parallel.dims import ParallelDims
from coati.plugins.validation import validate_layout

QWEN = Qwen2Config(num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2, hidden_size=128,
                   intermediate_size=512, vocab_size=101)
LLAMA = LlamaConfig(num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2, hidden_size=128,
                    intermediate_size=512, vocab_size=101)


@pytest.mark.parametrize("plugin, world, layout, config, message", [
    ("torch-tp", 4, ParallelDims(tp_size=4), QWEN, "does not divide the model's 2 key/value heads"),
    ("torch-tp", 3, ParallelDims(tp_size=3), QWEN, "does not divide the model's 4 attention heads"),
    ("torch-pp", 3, ParallelDims(pp_size=3), QWEN, "does not divide the model's 2 decoder layers"),
    ("torch-tp", 3, ParallelDims(tp_size=2), QWEN, "does not divide the 3 trainers"),
    ("colossalai-hybrid", 4, ParallelDims(tp_size=2, pp_size=2), None, None),
    ("colossalai-hybrid", 2, ParallelDims(tp_size=2, zero_stage=1), QWEN, "refuses ZeRO in fp32"),
    ("colossalai-hybrid", 2, ParallelDims(pp_size=2), LLAMA, "no stage policy for 'llama'"),
    ("colossalai-hybrid", 2, ParallelDims(tp_size=2), LLAMA, "no working policy for 'llama'"),
    ("colossalai-zero", 2, ParallelDims(zero_stage=0), QWEN, "needs zero stage 1 or 2"),
    ("colossalai-zero", 2, ParallelDims(zero_stage=2, tp_size=2), QWEN, "data parallel only"),
    ("torch-ddp", 2, ParallelDims(precision="fp16"), QWEN, "fp16 needs a loss scaler"),
    ("torch-pp", 2, ParallelDims(pp_size=2, precision="bf16"), QWEN, None),
    ("single", 2, ParallelDims(), None, "trains in one process"),
    ("torch-pp", 2, ParallelDims(pp_size=2), LLAMA, None),  # torch-pp builds Llama stages too
    ("colossalai-zero", 2, ParallelDims(zero_stage=2), QWEN, None),  # LowLevelZero trains fp32
])
def test_validate_layout(plugin, world, layout, config, message):
    if message is None:
        validate_layout(plugin, layout.on_world(world), config)
        return
    with pytest.raises(ValueError) as info:
        validate_layout(plugin, layout.on_world(world), config)
    text = str(info.value)
    assert message in text and "\n" not in text


def test_make_plugin_names_and_validation():
    assert isinstance(make_plugin("single"), SingleProcessPlugin)
    with pytest.raises(ValueError, match="unknown trainer plugin 'megatron'; choose one of single, torch-ddp"):
        make_plugin("megatron")
    with pytest.raises(ValueError, match="does not divide the model's 2 key/value heads"):
        make_plugin("torch-tp", tp_size=4, world_size=4, model_config=QWEN)
    for name in PLUGINS:  # every name constructs without a process group (the group is needed at setup)
        options = {"zero_stage": 2} if name == "colossalai-zero" else {}
        if name == "colossalai-zero" or name.startswith("colossalai-"):
            pytest.importorskip("colossalai")
        plugin = make_plugin(name, **options)
        assert plugin.rank == 0 and plugin.world_size == 1 and plugin.dp_size >= 1


def test_single_plugin_protocol_defaults():
    plugin = SingleProcessPlugin()
    assert (plugin.rank, plugin.world_size, plugin.dp_rank, plugin.dp_size, plugin.model_parallel_size) == (0, 1, 0, 1, 1)
    assert plugin.is_weight_sender
    plugin.close()  # a no-op by default
