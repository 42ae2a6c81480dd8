"""The part registries: every row's code resolves, the config reads its choices from them, and each
capability the code asks for is the one the row states."""

from __future__ import annotations

import subprocess
import sys

import pytest

from coati.registry import resolve
from coati.registry.backends import BACKENDS, backend_spec
from coati.registry.plugins import PLUGIN_FAMILIES, PLUGINS, plugin_for, plugin_spec
from coati.registry.weight_sync import DEFAULT_WEIGHT_SYNC, WEIGHT_SYNCS
from rewards import REWARD_TYPES, reward_type


def test_every_reference_resolves():
    references = [ref for spec in BACKENDS.values() for ref in (spec.build, spec.preflight, spec.wraps_trained_module,
                                                                    spec.offer)]
    references += [ref for spec in PLUGINS.values() for ref in (spec.build, spec.launch)]
    references += [ref for spec in WEIGHT_SYNCS.values() for ref in (spec.publisher, spec.receiver)]
    for reference in filter(None, references):
        assert callable(resolve(reference)), reference


@pytest.mark.parametrize("modules", [
    "coati.registry.backends, coati.registry.plugins, coati.registry.weight_sync, coati.algorithm.registry",
    "coati.parallel.dims, coati.plugins.validation, coati.cluster.memory",
    "coati.config.cli, coati.config.colocation, coati.config.validate, coati.config.grpo_config",
])
def test_config_and_the_registries_import_no_torch(modules):
    """config/ (floor 3) reads its choices from torch-free registries: importing it loads no torch."""
    code = f"import sys, {modules}; heavy = [m for m in ('torch', 'ray') if m in sys.modules]; assert not heavy, heavy"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize("family", PLUGIN_FAMILIES)
def test_each_layout_has_exactly_one_plugin_per_family(family):
    for n, tp, pp, zero in [(1, 1, 1, 0), (2, 1, 1, 0), (2, 1, 1, 1), (2, 1, 1, 3), (2, 2, 1, 0), (2, 1, 2, 0),
                            (4, 2, 2, 1), (4, 2, 1, 2)]:
        serving = [spec.name for spec in PLUGINS.values() if spec.family == family and spec.serves(n, tp, pp, zero)]
        assert len(serving) == 1, (family, n, tp, pp, zero, serving)


def test_plugin_for_picks_as_the_layout_flags_say():
    assert [plugin_for("torch", n, tp, pp, zero) for n, tp, pp, zero in
            [(1, 1, 1, 0), (2, 1, 1, 0), (2, 1, 1, 2), (2, 2, 1, 0), (2, 1, 2, 0)]] == \
        ["single", "torch-ddp", "torch-fsdp2", "torch-tp", "torch-pp"]
    assert [plugin_for("colossalai", n, tp, pp, zero) for n, tp, pp, zero in
            [(1, 1, 1, 0), (2, 1, 1, 1), (2, 2, 1, 0), (2, 1, 2, 1)]] == \
        ["colossalai-ddp", "colossalai-zero", "colossalai-hybrid", "colossalai-hybrid"]
    with pytest.raises(ValueError, match="unknown plugin family 'megatron'"):
        plugin_for("megatron", 1, 1, 1, 0)


def test_capabilities_the_code_asks_for():
    assert [name for name, spec in PLUGINS.items() if spec.full_module] == ["single", "torch-ddp"]
    assert [name for name, spec in PLUGINS.items() if spec.trains_adapters] == \
        ["single", "torch-ddp", "torch-fsdp2", "colossalai-ddp", "colossalai-zero"]
    assert [name for name, spec in BACKENDS.items() if spec.takes_adapters] == ["transformers", "vllm"]
    assert backend_spec("vllm").takes_adapters_of_rank(512) and not backend_spec("vllm").takes_adapters_of_rank(513)
    ddp = plugin_spec("colossalai-ddp")
    assert ddp.reads_state("torch-dcp", "fp32") and not ddp.reads_state("torch-dcp", "bf16")
    assert not plugin_spec("torch-ddp").reads_state("colossalai", "fp32")
    assert backend_spec("vllm").tensor_parallel and not backend_spec("transformers").tensor_parallel
    assert DEFAULT_WEIGHT_SYNC == "object-store" and WEIGHT_SYNCS[DEFAULT_WEIGHT_SYNC].keeps_published_object
    assert reward_type("code").label_key == "test_cases" and reward_type("boxed").label_key == "gt_answer"
    assert reward_type("think_answer_tags").stop_strings == ("</answer>",)
    assert [name for name, spec in REWARD_TYPES.items() if spec.runs_code] == ["code"]


def test_an_unknown_name_names_the_choices():
    with pytest.raises(ValueError, match="unknown inference backend 'sglang'; choose one of transformers, vllm"):
        backend_spec("sglang")
    with pytest.raises(ValueError, match="unknown reward type 'f1'"):
        reward_type("f1")
