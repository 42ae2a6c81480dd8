"""PyTorch-native data and tensor parallelism: DDP, FSDP2 (``fully_shard``) as ZeRO, DTensor TP, and dp x tp.

Layouts over the default process group of ``world_size`` ranks, as a 2-D DeviceMesh ``(dp, tp)``:
- ``ddp``: ``DistributedDataParallel`` (gradients all-reduced once per ``forward_backward``, on its last
  micro-batch; the others run under ``no_sync``).
- ``fsdp2``: ``fully_shard`` on every decoder layer and the root; parameters, gradients and optimizer
  states are sharded over dp. ZeRO stage -> reshard policy: 3 reshards parameters after forward
  (``reshard_after_forward=True``); 1 and 2 keep them gathered from forward to backward.
- ``tp``: ``parallelize_module`` on every decoder block (q/k/v/gate/up column-wise, o/down row-wise);
  embeddings, norms and the LM head stay replicated, so ``loss_fn`` sees full logits. With dp > 1 the TP
  model is also ``fully_shard``-ed over the dp mesh dimension (the usual 2-D FSDP2 + TP).

Precision bf16 (``coati.plugins.precision``): FSDP2-sharded models (fsdp2, tp over dp > 1) gather bf16
parameters through ``MixedPrecisionPolicy`` and reduce fp32 gradients; ddp and tp over one dp rank autocast.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from typing import Iterator

import torch
import torch.distributed as dist

from coati.models.lora import is_adapted, save_adapter, version_parameters
from coati.plugins.base import LossFn, MicroBatch, TrainerPlugin, causal_lm_logits
from coati.plugins.dist import clip_grads_, full_tensor, grad_norm_sq, trainer_device, world
from coati.plugins.mesh import TrainerMesh
from coati.plugins.precision import autocast, fsdp_policy
from coati.parallel.dims import ParallelDims
from coati.plugins.validation import validate_layout

# Module paths inside one Llama-family decoder block (Qwen2, Llama, Mistral share them).
TP_COLWISE = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
TP_ROWWISE = ("self_attn.o_proj", "mlp.down_proj")


def decoder_layers(model: torch.nn.Module):
    """The decoder blocks of an HF causal LM (``model.model.layers``; under a peft model's wrapper)."""
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    try:
        return model.model.layers
    except AttributeError:
        raise ValueError(f"{type(model).__name__} has no model.layers; only Llama-family decoders are supported") from None


def apply_tensor_parallel(model: torch.nn.Module, tp_mesh) -> None:
    """Shard every decoder block's attention and MLP over ``tp_mesh`` (Megatron-style column/row pairs)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    plan = {**{name: ColwiseParallel() for name in TP_COLWISE}, **{name: RowwiseParallel() for name in TP_ROWWISE}}
    for layer in decoder_layers(model):
        parallelize_module(layer, tp_mesh, plan)


def apply_fsdp2(model: torch.nn.Module, dp_mesh, zero_stage: int, precision: str = "fp32") -> None:
    from torch.distributed.fsdp import fully_shard

    reshard = zero_stage >= 3
    policy = fsdp_policy(precision)
    kwargs = {"mp_policy": policy} if policy is not None else {}
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=dp_mesh, reshard_after_forward=reshard, **kwargs)
    fully_shard(model, mesh=dp_mesh, reshard_after_forward=reshard, **kwargs)


class TorchNativePlugin(TrainerPlugin):
    KINDS = ("ddp", "fsdp2", "tp")

    def __init__(self, kind: str, layout: ParallelDims | None = None, mesh: TrainerMesh | None = None):
        if kind not in self.KINDS:
            raise ValueError(f"unknown torch-native layout {kind!r}; choose one of {self.KINDS}")
        self.kind = kind
        self.layout = layout or ParallelDims()
        self.module: torch.nn.Module | None = None  # the HF model (parameters possibly DTensors)
        self.wrapped: torch.nn.Module | None = None  # what forward runs through (DDP wrapper or the module)
        self.optimizer: torch.optim.Optimizer | None = None
        self._use_mesh(mesh)

    # --- layout ---
    @property
    def tp_size(self) -> int:
        return self.layout.tp_size

    @property
    def is_weight_sender(self) -> bool:
        return self.rank == 0

    def setup(self, model, learning_rate, betas=(0.9, 0.99), weight_decay=0.0, gradient_checkpointing=False) -> None:
        from coati.plugins.optim import enable_gradient_checkpointing, make_adamw

        validate_layout(f"torch-{self.kind}", self.layout.on_world(world()[1]), getattr(model, "config", None))
        self._resolve_mesh()
        self.device = trainer_device()
        # the full model on every rank's device first: DDP, fully_shard and parallelize_module all expect the
        # parameters (and buffers such as rotary frequencies) on the mesh's device
        self.module = model.to(self.device).train()
        if gradient_checkpointing:
            enable_gradient_checkpointing(model)
        self._sharded = False
        if self.kind == "ddp":
            if self.world_size > 1:
                from torch.nn.parallel import DistributedDataParallel

                device_ids = [self.device.index] if self.device.type == "cuda" else None
                self.wrapped = DistributedDataParallel(model, device_ids=device_ids)
            else:
                self.wrapped = model
        else:
            device_mesh = self.mesh.device_mesh(self.device.type)
            if self.tp_size > 1:
                apply_tensor_parallel(model, device_mesh["tp"])
            if self.kind == "fsdp2" or self.dp_size > 1:
                apply_fsdp2(model, device_mesh["dp"], self.layout.zero_stage, self.layout.precision)
                self._sharded = True
            self.wrapped = model
        self.optimizer = make_adamw(model, learning_rate, betas, weight_decay)

    def _forward(self, micro_batch: MicroBatch) -> torch.Tensor:
        """The logits of ``micro_batch``; autocast unless FSDP2's policy already computes in the precision."""
        precision = "fp32" if self._sharded else self.layout.precision
        with autocast(self.device, precision):
            return causal_lm_logits(self.wrapped, micro_batch)

    # --- training ---
    def _sync_context(self, last: bool):
        """Gradient reduction only on the last micro-batch of a call (accumulate locally before)."""
        if self.kind == "ddp" and self.world_size > 1:
            return nullcontext() if last else self.wrapped.no_sync()
        if hasattr(self.wrapped, "set_requires_gradient_sync"):  # FSDP2 root
            self.wrapped.set_requires_gradient_sync(last)
        return nullcontext()

    def forward_backward(self, micro_batches: list[MicroBatch], loss_fn: LossFn):
        stats = []
        for index, micro_batch in enumerate(self._on_device(micro_batches)):
            with self._sync_context(index == len(micro_batches) - 1):
                loss, micro_stats = loss_fn(self._forward(micro_batch), micro_batch)
                loss.backward()
            stats.append(micro_stats)
        return stats

    @torch.no_grad()
    def forward_only(self, micro_batches: list[MicroBatch], fn):
        # the wrapped module: FSDP2 gathers its shards in forward; DDP's forward without grad reduces nothing
        return [fn(self._forward(m), m) for m in self._on_device(micro_batches)]

    def optimizer_step(self, max_grad_norm):
        params = [p for p in self.module.parameters() if p.grad is not None]
        norm = math.sqrt(float(grad_norm_sq(params)))
        if max_grad_norm:
            clip_grads_(params, norm, max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    # --- weights out ---
    def named_full_tensors(self, include_frozen: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
        for name, param in version_parameters(self.module, include_frozen):
            tensor = full_tensor(param)  # collective for DTensors: every rank gets here in the same order
            if self.is_weight_sender:
                yield name, tensor.cpu()

    def named_full_tensors_everywhere(self, include_frozen: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
        for name, param in version_parameters(self.module, include_frozen):
            yield name, full_tensor(param)  # DTensor gathers leave the full value on every rank

    def full_module(self) -> torch.nn.Module | None:
        return self.module if self.kind == "ddp" else None

    def save_pretrained(self, path: str) -> None:
        state = dict(self.named_full_tensors())  # every rank takes part in the gathers
        if self.is_weight_sender:
            if is_adapted(self.module):
                save_adapter(self.module, state, path)
            else:
                save_hf(self.module, state, path)
        if self.world_size > 1:
            dist.barrier()

    # --- trainer state (DCP: DTensor shards are written by their owners, resharded on load) ---
    def _manifest(self) -> dict:
        from coati.plugins.state import layout_manifest

        return layout_manifest(f"torch-{self.kind}", self.world_size, tp_size=self.tp_size,
                               zero_stage=self.layout.zero_stage, precision=self.layout.precision)

    def save_state(self, path: str) -> None:
        from coati.plugins.state import save_dcp

        save_dcp(path, self.module, self.optimizer, self._manifest())

    def load_state(self, path: str) -> None:
        from coati.plugins.state import load_dcp

        load_dcp(path, self.module, self.optimizer, self._manifest())

    def close(self) -> None:
        self.optimizer = None
        self.wrapped = None
        self._close_mesh()


def save_hf(module: torch.nn.Module, state: dict[str, torch.Tensor], path: str) -> None:
    """Write ``state`` (full tensors, HF names) as an HF directory with ``module``'s config."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    # the model's own head: a reward model (``...ForSequenceClassification``) saves as one
    architectures = getattr(module.config, "architectures", None) or []
    auto = (AutoModelForSequenceClassification if any(a.endswith("ForSequenceClassification") for a in architectures)
            else AutoModelForCausalLM)
    with torch.device("meta"):
        fresh = auto.from_config(module.config, dtype=next(iter(state.values())).dtype)
    fresh.load_state_dict(state, strict=False, assign=True)
    if getattr(module.config, "tie_word_embeddings", False):
        fresh.tie_weights()
    missing = [name for name, param in fresh.named_parameters() if param.is_meta]
    if missing:
        raise RuntimeError(f"save_pretrained: no gathered tensor for {missing[:3]}")
    fresh.save_pretrained(path)
