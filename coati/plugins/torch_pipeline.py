"""Pipeline parallelism with ``torch.distributed.pipelining`` (GPipe), optionally x data parallel.

Ranks form a ``(dp, pp)`` grid, ``rank = dp_rank * pp + stage`` (the trainer mesh, coati.plugins.mesh, with tp 1). Each stage owns a contiguous slice of the
decoder layers (stage 0 also the embedding, the last stage also the final norm and the LM head), built by
``DecoderStage`` with the HF parameter names. The micro-batches of one ``forward_backward`` call are the
pipeline's micro-batches; ``loss_fn`` runs on the last stage (its statistics are broadcast to every stage),
and every stage receives each micro-batch's ``attention_mask`` (it builds its own causal masks and rotary
embeddings, as the family's HF model forward does in transformers 5.19, and the last stage's logits go through the
family's head shaping: coati.models.families.decoder_stage).

Tied embeddings (Qwen2 small models): the first and last stages each keep a copy; their gradients are
summed over a first/last process group before the optimizer step, so the copies stay identical; the copy
counts once in the gradient norm and is published once (as ``model.embed_tokens.weight``).
Data parallelism: gradients are averaged over the ranks holding the same stage, once per optimizer step.
Precision bf16: each stage's forward runs under autocast (fp32 parameters; coati.plugins.precision).

A schedule (``PipelineStage`` + ``ScheduleGPipe``) is built per (micro-batch count, shape) and cached (8 at
most); building one runs torch's metadata inference (one extra forward/backward of a micro-batch), so
variable sequence lengths pay that once per new shape: pad to a few length buckets in real runs.
"""

from __future__ import annotations

import math
from typing import Iterator

import torch
import torch.distributed as dist

from coati.plugins.base import LossFn, MicroBatch, TrainerPlugin
from coati.plugins.dist import clip_grads_, trainer_device, world
from coati.plugins.mesh import TrainerMesh
from coati.plugins.precision import autocast
from coati.parallel.dims import ParallelDims
from coati.plugins.validation import validate_layout


def stage_bounds(num_layers: int, num_stages: int, stage: int) -> tuple[int, int]:
    per = num_layers // num_stages
    return stage * per, (stage + 1) * per


class DecoderStage(torch.nn.Module):
    """Layers ``[start, end)`` of a decoder causal LM (plus embedding / head on the first / last stage).

    Parameter names match the full HF model (``model.layers.3.mlp.up_proj.weight``...).
    """

    def __init__(self, model: torch.nn.Module, start: int, end: int, first: bool, last: bool,
                 precision: str = "fp32"):
        super().__init__()
        self.config = model.config
        self.precision = precision
        self.first, self.last = first, last
        inner = torch.nn.Module()
        inner.config = model.config  # not a module: decoder_stage reads the family's fields from it
        inner.layers = torch.nn.ModuleDict({str(i): model.model.layers[i] for i in range(start, end)})
        inner.rotary_emb = model.model.rotary_emb
        if first:
            inner.embed_tokens = model.model.embed_tokens
        if last:
            inner.norm = model.model.norm
        self.model = inner
        if last:
            self.lm_head = model.lm_head

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        with autocast(x.device, self.precision):
            return self._layers(x, attention_mask)

    def _layers(self, x: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        from coati.models.families import decoder_stage

        layers = {int(index): layer for index, layer in self.model.layers.items()}
        return decoder_stage(self.model, layers, x, attention_mask, self.first, self.last,
                             self.lm_head if self.last else None)


class TorchPipelinePlugin(TrainerPlugin):
    ragged_micro_batches = False  # the schedule splits one batch into equal micro-batches

    def __init__(self, layout: ParallelDims | None = None, mesh: TrainerMesh | None = None):
        self.layout = layout or ParallelDims(pp_size=2)
        self._use_mesh(mesh)
        self.stage_module: DecoderStage | None = None
        self.optimizer = None
        self._schedules: dict = {}
        self._hf_names: list[str] = []
        self._owners: dict[str, int] = {}
        self._tied = False
        self.pp_group = self.dp_group = self.tie_group = None

    @property
    def pp_size(self) -> int:
        return self.layout.pp_size

    @property
    def stage(self) -> int:
        return self.mesh.pp_rank

    @property
    def is_weight_sender(self) -> bool:
        return self.rank == 0

    def setup(self, model, learning_rate, betas=(0.9, 0.99), weight_decay=0.0, gradient_checkpointing=False) -> None:
        from coati.plugins.optim import enable_gradient_checkpointing, make_adamw

        validate_layout("torch-pp", self.layout.on_world(world()[1]), model.config)
        if gradient_checkpointing:  # on the decoder layers, which the stages call directly
            enable_gradient_checkpointing(model)
        mesh = self._resolve_mesh()
        self.pp_group, self.dp_group = mesh.group("pp", single=True), mesh.group("dp")
        self._hf_names = [name for name, _ in model.named_parameters()]
        self._tied = model.get_output_embeddings() is not None and \
            model.get_output_embeddings().weight is model.get_input_embeddings().weight
        if self._tied:
            self.tie_group = mesh.stage_ends_group()
        pp = self.pp_size
        start, end = stage_bounds(model.config.num_hidden_layers, pp, self.stage)
        self.stage_module = DecoderStage(model.train(), start, end, self.stage == 0, self.stage == pp - 1,
                                         self.layout.precision)
        if self._tied and self.stage == pp - 1:  # own copy of the tied weight on the last stage
            self.stage_module.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
        self.device = trainer_device()
        self.stage_module.to(self.device)  # this stage's layers only: the rest of the model stays on the CPU
        self.optimizer = make_adamw(self.stage_module, learning_rate, betas, weight_decay)
        local = dict(self.stage_module.named_parameters())
        mine = {name: self.rank for name in self._hf_names if name in local} if self.dp_rank == 0 else {}
        tables: list = [None] * self.world_size
        dist.all_gather_object(tables, mine)
        for table in tables:
            for name, owner in table.items():
                self._owners.setdefault(name, owner)

    # --- training ---
    def _schedule(self, n: int, shape: tuple, loss_fn):
        from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

        key = (n, shape)
        if key not in self._schedules:
            if len(self._schedules) >= 8:  # shapes vary with sequence length: keep the newest few
                self._schedules.pop(next(iter(self._schedules)))
            stage = PipelineStage(self.stage_module, self.stage, self.pp_size, self.device, group=self.pp_group)
            self._schedules[key] = ScheduleGPipe(stage, n, loss_fn=self._loss_adapter, scale_grads=False)
        return self._schedules[key]

    def _loss_adapter(self, logits, index):
        micro_batch = self._current[int(index)]
        loss, stats = self._loss_fn(logits, micro_batch)
        # CPU copies: they are pickled to the other stages, where a CUDA tensor would name the sender's GPU
        self._stats[int(index)] = {k: v.detach().float().cpu() for k, v in stats.items()}
        return loss

    def forward_backward(self, micro_batches: list[MicroBatch], loss_fn: LossFn):
        micro_batches = self._on_device(micro_batches)
        self._loss_fn, self._stats = loss_fn, {}
        start = 0
        while start < len(micro_batches):  # runs of equal shape share one pipeline schedule
            shape = tuple(micro_batches[start]["input_ids"].shape)
            end = start
            while end < len(micro_batches) and tuple(micro_batches[end]["input_ids"].shape) == shape:
                end += 1
            run = micro_batches[start:end]
            self._current = run
            schedule = self._schedule(len(run), shape, loss_fn)
            args = [(mb["input_ids"],) for mb in run] if self.stage == 0 else None
            kwargs = [{"attention_mask": mb["attention_mask"]} for mb in run]
            stats_before = self._stats
            self._stats = {}
            # what ScheduleGPipe.step() does before _step_microbatches (we pass pre-split micro-batches)
            schedule._stage.has_backward = schedule._has_backward
            schedule._stage.clear_runtime_states()
            schedule._step_microbatches(arg_mbs=args, kwarg_mbs=kwargs, target_mbs=[torch.tensor(i) for i in range(len(run))],
                                        losses=None, return_outputs=False)
            stats_before.update({start + i: s for i, s in self._stats.items()})
            self._stats = stats_before
            start = end
        ordered = [self._stats[i] for i in range(len(micro_batches))] if self.stage == self.pp_size - 1 else None
        payload = [ordered]
        dist.broadcast_object_list(payload, src=self.mesh.last_in("pp"), group=self.pp_group)
        self._current = None
        return payload[0]

    def _norm_params(self):
        """Parameters whose gradients count in the norm (the tied copy on the last stage is skipped)."""
        for name, param in self.stage_module.named_parameters():
            if self._tied and name == "lm_head.weight":
                continue
            yield param

    def optimizer_step(self, max_grad_norm):
        params = [p for p in self.stage_module.parameters() if p.grad is not None]
        if self.dp_group is not None:
            for param in params:
                dist.all_reduce(param.grad, group=self.dp_group)
                param.grad /= self.dp_size
        if self._tied and self.stage in (0, self.pp_size - 1):
            tied = self.stage_module.model.embed_tokens.weight if self.stage == 0 else self.stage_module.lm_head.weight
            if tied.grad is None:
                tied.grad = torch.zeros_like(tied)
            dist.all_reduce(tied.grad, group=self.tie_group)
            params = [p for p in self.stage_module.parameters() if p.grad is not None]
        local = torch.zeros((), dtype=torch.float64, device=self.device)  # all-reduced over the stages
        for param in self._norm_params():
            if param.grad is not None:
                local += torch.linalg.vector_norm(param.grad.float()).double() ** 2
        dist.all_reduce(local, group=self.pp_group)
        norm = math.sqrt(float(local))
        if max_grad_norm:
            clip_grads_(params, norm, max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    # --- weights out ---
    def named_full_tensors(self, include_frozen: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
        if self.dp_rank != 0:
            return
        local = dict(self.stage_module.named_parameters())
        for name in self._hf_names:
            owner = self._owners[name]
            if self.is_weight_sender:
                if owner == self.rank:
                    yield name, local[name].detach().cpu()
                else:
                    payload = [None]
                    dist.recv_object_list(payload, src=owner)
                    yield name, payload[0]
            elif owner == self.rank:
                dist.send_object_list([local[name].detach().cpu()], dst=0)

    def save_pretrained(self, path: str) -> None:
        from coati.plugins.torch_native import save_hf

        state = dict(self.named_full_tensors())
        if self.is_weight_sender:
            save_hf(self.stage_module, state, path)
        dist.barrier()

    # --- trainer state (DCP; each stage writes its own parameters under their HF names) ---
    def _state_args(self) -> tuple[dict, dict]:
        """The manifest, and the checkpoint name of the last stage's tied-embedding copy (the first stage's name,
        as a full model stores it: both stages write, and read, one tensor)."""
        from coati.plugins.state import layout_manifest

        manifest = layout_manifest("torch-pp", self.world_size, pp_size=self.pp_size, precision=self.layout.precision)
        last_copy = self._tied and self.stage == self.pp_size - 1
        return manifest, ({"lm_head.weight": "model.embed_tokens.weight"} if last_copy else {})

    def save_state(self, path: str) -> None:
        from coati.plugins.state import save_dcp

        manifest, renames = self._state_args()
        save_dcp(path, self.stage_module, self.optimizer, manifest, renames)

    def load_state(self, path: str) -> None:
        from coati.plugins.state import load_dcp

        manifest, renames = self._state_args()
        load_dcp(path, self.stage_module, self.optimizer, manifest, renames)

    def close(self) -> None:
        self._schedules.clear()
        self.pp_group = self.dp_group = self.tie_group = None
        self._close_mesh()
