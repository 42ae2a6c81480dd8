"""Trainer-state checkpoints (parameters + optimizer state) shared by the plugins' ``save_state`` / ``load_state``.

A checkpoint is a directory with a manifest, ``trainer_state.json`` (format, plugin, tp/pp/dp sizes, zero
stage, precision), and the state in one of two formats:

- ``torch-dcp``, written by single and torch-ddp/fsdp2/tp/pp: ``torch.distributed.checkpoint`` of
  ``{"model": parameters by HF name, "optim": AdamW state flattened per HF name}`` (DCP's
  ``flatten_optimizer_state_dict``: ``state.<name>.exp_avg``, ``param_groups.<name>.lr``, ...). Every rank
  writes the shards it owns (its DTensor shards under FSDP2/TP, its stage under PP; replicated tensors are
  written once, spread over the ranks), and DCP reshards on load, so each of these layouts (and
  colossalai-ddp) loads the others' checkpoints. Entries per parameter name, not per optimizer, are what make
  pipeline stages (one optimizer each) interchangeable with one full model. Tied embeddings are stored once,
  under the input-embedding name: the output-embedding alias is dropped, and the pipeline's last stage
  stores its own copy (kept equal to the first stage's) under that name, so both stages write and read one
  tensor.
- ``colossalai``, written by the ColossalAI plugins: the Booster's sharded checkpoint (see
  ``coati.plugins.colossal``).

Loading reads the manifest first and raises ``ValueError`` (one line naming the saved and requested
layouts) when this plugin cannot read the format, or when DCP finds tensors that do not fit. RNG states are
the caller's business.
"""

from __future__ import annotations

import json
import os
import warnings
from contextlib import contextmanager

import torch
import torch.distributed as dist

from coati.parallel.dims import ParallelDims
from coati.registry.plugins import COLOSSAL as COLOSSAL_FORMAT
from coati.registry.plugins import DCP as DCP_FORMAT

MANIFEST = "trainer_state.json"


def layout_manifest(plugin: str, world_size: int, tp_size: int = 1, pp_size: int = 1, zero_stage: int = 0,
                    precision: str = "fp32") -> dict:
    """A layout as the manifest names it (the writer adds ``format``)."""
    return {"plugin": plugin, "world_size": world_size, "tp_size": tp_size, "pp_size": pp_size,
            "dp_size": ParallelDims(world_size, tp_size, pp_size).dp_size, "zero_stage": zero_stage, "precision": precision}


def describe(manifest: dict) -> str:
    """``torch-fsdp2 (dp=2 tp=1 pp=1 zero=0 fp32)``: a layout in one line, for error messages."""
    return (f"{manifest['plugin']} (dp={manifest['dp_size']} tp={manifest['tp_size']} pp={manifest['pp_size']} "
            f"zero={manifest['zero_stage']} {manifest['precision']})")


def write_manifest(path: str, manifest: dict) -> None:
    with open(os.path.join(path, MANIFEST), "w") as file:
        json.dump(manifest, file, indent=1)


def read_manifest(path: str, requested: dict) -> dict:
    file = os.path.join(path, MANIFEST)
    if not os.path.isfile(file):
        raise ValueError(f"{path} is not a trainer-state checkpoint (no {MANIFEST}); cannot load it into "
                         f"{describe(requested)}")
    with open(file) as handle:
        return json.load(handle)


def incompatible(path: str, saved: dict, requested: dict, why: str) -> ValueError:
    return ValueError(f"cannot load the {describe(saved)} trainer state in {path} into {describe(requested)}: {why}")


def _is_multi_rank(no_dist: bool) -> bool:
    return not no_dist and dist.is_initialized() and dist.get_world_size() > 1


@contextmanager
def _quiet(no_dist: bool):
    """DCP warns that it "assumes a single process" whenever no group is up, even when told so (``no_dist``)."""
    with warnings.catch_warnings():
        if no_dist:
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


# --- torch-dcp ---
def _options(strict: bool = True):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # Frozen parameters (a LoRA model's base) are the model directory's, not the run's: they are not saved, and
    # a load leaves them as they are (strict=False: dcp.load already found every saved key the module has).
    return StateDictOptions(flatten_optimizer_state_dict=True, ignore_frozen_params=True, strict=strict)


def _tied_aliases(module: torch.nn.Module) -> dict[str, str]:
    """Second names of shared parameters -> the first name (``lm_head.weight`` -> ``model.embed_tokens.weight``)."""
    first: dict[int, str] = {}
    aliases = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        kept = first.setdefault(id(param), name)
        if kept != name:
            aliases[name] = kept
    return aliases


def _renamed(key: str, renames: dict[str, str]) -> str:
    """``key`` of the model or flattened optimizer state dict with its parameter name mapped through ``renames``."""
    for prefix in ("", "state.", "param_groups."):
        for old, new in renames.items():
            if key.startswith(prefix + old) and (len(key) == len(prefix + old) or key[len(prefix + old)] == "."):
                return prefix + new + key[len(prefix + old):]
    return key


def _dcp_state(module, optimizer, renames: dict[str, str], with_optimizer: bool):
    """The DCP state of ``module`` (+ ``optimizer``) under checkpoint names; also the aliases that were dropped."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    if with_optimizer:
        model_sd, optim_sd = get_state_dict(module, optimizer, options=_options())
    else:
        model_sd, optim_sd = get_model_state_dict(module, options=_options()), {}
    aliases = _tied_aliases(module)
    for alias in aliases:
        model_sd.pop(alias, None)
    state = {"model": {_renamed(k, renames): v for k, v in model_sd.items()},
             "optim": {_renamed(k, renames): v for k, v in optim_sd.items()}}
    return state, aliases


def save_dcp(path: str, module: torch.nn.Module, optimizer, manifest: dict, renames: dict[str, str] | None = None,
             no_dist: bool = False) -> None:
    """Collective (unless ``no_dist``): every rank writes its shards of ``module``/``optimizer`` into ``path``."""
    import torch.distributed.checkpoint as dcp

    # Before the first step AdamW has no state, and get_state_dict would create it with a zero-gradient step
    # (step count 1), changing the run being saved: save the parameters only, the loader keeps a fresh AdamW.
    with_optimizer = bool(optimizer.state)
    state, _ = _dcp_state(module, optimizer, renames or {}, with_optimizer)
    os.makedirs(path, exist_ok=True)
    with _quiet(no_dist):
        dcp.save(state, checkpoint_id=path, no_dist=no_dist)
    multi = _is_multi_rank(no_dist)
    if not multi or dist.get_rank() == 0:
        write_manifest(path, {"format": DCP_FORMAT, **manifest, "optimizer_state": with_optimizer})
    if multi:
        dist.barrier()  # the manifest is there when save_state returns on any rank


def load_dcp(path: str, module: torch.nn.Module, optimizer, requested: dict, renames: dict[str, str] | None = None,
             no_dist: bool = False) -> None:
    """Collective (unless ``no_dist``): restore ``module``/``optimizer`` from a torch-dcp checkpoint of any layout."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

    saved = read_manifest(path, requested)
    if saved.get("format") != DCP_FORMAT:
        raise incompatible(path, saved, requested, f"it is a {saved.get('format')!r} checkpoint, this plugin "
                           f"reads {DCP_FORMAT!r} ones")
    renames = renames or {}
    with_optimizer = saved.get("optimizer_state", True)
    state, aliases = _dcp_state(module, optimizer, renames, with_optimizer)
    try:
        with _quiet(no_dist):  # loads in place into the (sharded) tensors of ``state``
            dcp.load(state, checkpoint_id=path, no_dist=no_dist)
    except (Exception, CheckpointException) as error:  # CheckpointException (a BaseException) has every
        reason = str(error).strip().splitlines()         # failing rank's traceback: keep its last line
        raise incompatible(path, saved, requested, reason[-1] if reason else type(error).__name__) from error
    back = {new: old for old, new in renames.items()}
    model_sd = {_renamed(k, back): v for k, v in state["model"].items()}
    for alias, name in aliases.items():
        if name in model_sd:  # frozen tied weights are not in the state
            model_sd[alias] = model_sd[name]
    # set_*_state_dict load the non-tensor values (param_groups) and run FSDP2's and the optimizer's load hooks
    if with_optimizer:
        optim_sd = {_renamed(k, back): v for k, v in state["optim"].items()}
        set_state_dict(module, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd,
                       options=_options(strict=False))
    else:
        set_model_state_dict(module, model_sd, options=_options(strict=False))
