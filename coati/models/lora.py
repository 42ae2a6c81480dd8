"""LoRA adapters through peft: adding them to a model, what a weight version holds, merging, PEFT directories.

A model with adapters is a ``peft.PeftModel``; its parameter names carry peft's prefix and adapter name
(``base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight``), identical in the trainer and in
an inference engine built with the same settings, so adapter tensors travel by name like full weights do.

- ``add_adapters``: the adapters on ``model`` (A from a fixed seed, B = 0: the adapted model equals the base
  until it trains); the caller's random stream is left untouched, so an engine that adds them samples the same
  as one that does not.
- ``version_parameters``: the parameters a weight version holds: every one, or with adapters the trained ones
  (the adapters, and a critic's head), not the frozen base.
- ``merged_tensors``: adapter-model tensors -> the plain HF model's, each adapted weight ``W + (alpha / r) B A``
  (a weight version for engines that take full weights only; equal to peft's ``merge_and_unload``, which
  ``export_merged`` uses).
- ``save_adapter`` / ``load_adapter_weights`` / ``load_adapted`` / ``export_merged``: PEFT's directory format
  (``adapter_config.json``, ``adapter_model.safetensors``), which ``peft.PeftModel.from_pretrained`` and
  vLLM's LoRA loader read.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from typing import Iterable, Iterator

import torch

ADAPTER = "default"  # peft's name of a model's one adapter
ALL_LINEAR = "all-linear"  # peft's target for every linear layer but the output head
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_PREFIX = "base_model.model."
_ADAPTER_SEED = 0


def is_adapted(model) -> bool:
    """Whether ``model`` is a peft model (peft is imported only by runs that use adapters)."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def add_adapters(model: torch.nn.Module, lora, trained_modules: tuple[str, ...] = ()) -> torch.nn.Module:
    """``model`` with LoRA adapters as ``lora`` (a ``coati.config.lora.LoraConfig``) says; base weights frozen.
    ``trained_modules``: modules trained in full beside the adapters (a critic's fresh value head), never adapted
    themselves."""
    from peft import LoraConfig as PeftLoraConfig, get_peft_model

    targets = list(lora.targets)
    peft_config = PeftLoraConfig(
        r=lora.lora_rank, lora_alpha=lora.lora_alpha, lora_dropout=lora.lora_dropout, bias="none",
        target_modules=ALL_LINEAR if targets == [ALL_LINEAR] else targets,
        modules_to_save=list(trained_modules) or None, exclude_modules=list(trained_modules) or None)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_ADAPTER_SEED)
        try:
            return get_peft_model(model, peft_config)
        except ValueError as error:  # e.g. a target module the model does not have
            raise ValueError(f"--lora-target-modules {' '.join(targets)}: {error}") from None


def version_parameters(model: torch.nn.Module, include_frozen: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, parameter) of what one weight version holds: all of them, or a peft model's trained ones only
    (``include_frozen``: all of them anyway, e.g. to merge)."""
    adapted = is_adapted(model)
    for name, param in model.named_parameters():
        if include_frozen or not adapted or param.requires_grad:
            yield name, param


@contextmanager
def adapters_off(model: torch.nn.Module):
    """Context in which ``model`` computes as its base (no-op for a model without adapters).

    Only each adapter layer's switch is flipped: peft's own ``disable_adapter`` also clears and restores the
    adapters' ``requires_grad``, which under FSDP2 lands on whichever parameter objects are registered at that
    moment (the unsharded ones after a forward that keeps them gathered), leaving the sharded ones frozen."""
    if not is_adapted(model):
        yield
        return
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [module for module in model.modules() if isinstance(module, BaseTunerLayer)]
    switches = [layer._disable_adapters for layer in layers]
    for layer in layers:
        layer._disable_adapters = True
    try:
        yield
    finally:
        for layer, switch in zip(layers, switches):
            layer._disable_adapters = switch


def merged_tensors(named_tensors: Iterable[tuple[str, torch.Tensor]], lora) -> Iterator[tuple[str, torch.Tensor]]:
    """The plain HF model's tensors from a peft model's full tensors (frozen ones included): each adapted
    linear weight becomes ``W + (alpha / r) B @ A`` (in fp32, then W's dtype), a trained module's copy replaces
    the original, peft's prefix goes."""
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in named_tensors:
        name = name.removeprefix(_PREFIX)
        for part in ("base_layer.weight", f"lora_A.{ADAPTER}.weight", f"lora_B.{ADAPTER}.weight"):
            if name.endswith("." + part):
                module = name[: -len(part) - 1]
                pending.setdefault(module, {})[part.split(".")[0]] = tensor
                if len(pending[module]) == 3:
                    yield module + ".weight", _merge(pending.pop(module), lora.scaling)
                break
        else:
            if ".lora_" in name:
                raise ValueError(f"cannot merge adapter tensor {name!r}: only adapters on linear layers merge")
            if ".original_module." in name:
                continue
            yield name.replace(".base_layer.", ".").replace(f".modules_to_save.{ADAPTER}.", "."), tensor
    if pending:
        raise ValueError(f"incomplete adapter tensors for {sorted(pending)[:3]}: every adapted weight needs its "
                         "base weight, lora_A and lora_B")


def _merge(parts: dict[str, torch.Tensor], scaling: float) -> torch.Tensor:
    weight = parts["base_layer"]
    delta = parts["lora_B"].float() @ parts["lora_A"].float()
    return (weight.float() + scaling * delta).to(weight.dtype)


def save_adapter(model: torch.nn.Module, tensors: dict[str, torch.Tensor], path: str) -> None:
    """Write ``model``'s adapter as a PEFT directory from ``tensors`` (its full trained tensors by parameter
    name, e.g. gathered from shards)."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    state = get_peft_model_state_dict(model, state_dict=tensors, adapter_name=ADAPTER)
    os.makedirs(path, exist_ok=True)
    model.peft_config[ADAPTER].save_pretrained(path)
    save_file({name: tensor.detach().cpu().contiguous() for name, tensor in state.items()},
              os.path.join(path, ADAPTER_WEIGHTS), metadata={"format": "pt"})


def load_adapter_weights(model: torch.nn.Module, path: str) -> None:
    """Copy the adapter weights of PEFT directory ``path`` into ``model``'s adapters, in place (a wrapper's or a
    ZeRO optimizer's references to the parameters stay valid)."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    result = set_peft_model_state_dict(model, load_file(os.path.join(path, ADAPTER_WEIGHTS)), adapter_name=ADAPTER)
    missing = [name for name in result.missing_keys if ".lora_" in name]
    if result.unexpected_keys or missing:
        raise ValueError(f"the adapter in {path} does not fit this model: "
                         f"{(result.unexpected_keys or missing)[:3]} unexpected or missing")


def is_adapter_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, ADAPTER_CONFIG))


def adapter_base(path: str) -> str:
    """The base model an adapter directory was trained on (its ``base_model_name_or_path``)."""
    import json

    with open(os.path.join(path, ADAPTER_CONFIG)) as handle:
        return json.load(handle).get("base_model_name_or_path") or ""


def config_dir(path: str) -> str:
    """Where a model directory's ``config.json`` lies: the directory itself, or an adapter directory's base."""
    return adapter_base(path) if is_adapter_dir(path) else path


def load_adapted(path: str, dtype=torch.float32, base: str | None = None) -> torch.nn.Module:
    """The base model (``base``, else the one the adapter names) with the adapter directory ``path`` on it."""
    from peft import PeftModel

    from coati.models.families import load_causal_lm

    base = base or adapter_base(path)
    if not os.path.isdir(base):
        raise FileNotFoundError(f"{path} is a LoRA adapter whose base model {base or '(not named)'} is not a "
                                "directory here: pass the base model's directory (--base)")
    model = load_causal_lm(base, dtype=dtype)
    return PeftModel.from_pretrained(model, path)


def export_merged(adapter_dir: str, out: str, base: str | None = None) -> str:
    """A plain HF directory (``from_pretrained`` loads it) with the adapter merged into the base weights, and the
    tokenizer of the adapter directory (checkpoints keep one there) or of the base."""
    from transformers import AutoTokenizer

    model = load_adapted(adapter_dir, base=base)
    merged = model.merge_and_unload()
    merged.save_pretrained(out)
    has_tokenizer = any(os.path.isfile(os.path.join(adapter_dir, f)) for f in ("tokenizer.json", "tokenizer_config.json"))
    AutoTokenizer.from_pretrained(adapter_dir if has_tokenizer else (base or adapter_base(adapter_dir))).save_pretrained(out)
    return out
