"""One process, no parallelism: the reference layout every other plugin must agree with (bf16: autocast)."""

from __future__ import annotations

from typing import Iterator

import torch

from coati.models.lora import version_parameters
from coati.plugins.base import LossFn, MicroBatch, TrainerPlugin, causal_lm_logits
from coati.plugins.precision import autocast
from coati.parallel.dims import ParallelDims


class SingleProcessPlugin(TrainerPlugin):
    def __init__(self, layout: ParallelDims | None = None):
        self.layout = layout or ParallelDims()
        self.model: torch.nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None

    def setup(self, model, learning_rate, betas=(0.9, 0.99), weight_decay=0.0, gradient_checkpointing=False) -> None:
        from coati.plugins.dist import trainer_device
        from coati.plugins.optim import enable_gradient_checkpointing, make_adamw
        from coati.plugins.validation import validate_layout

        validate_layout("single", self.layout.on_world(1))
        self.device = trainer_device()
        self.model = model.to(self.device).train()
        if gradient_checkpointing:
            enable_gradient_checkpointing(model)
        self.optimizer = make_adamw(model, learning_rate, betas, weight_decay)

    def _logits(self, micro_batch: MicroBatch) -> torch.Tensor:
        with autocast(self.device, self.layout.precision):
            return causal_lm_logits(self.model, micro_batch)

    def forward_backward(self, micro_batches: list[MicroBatch], loss_fn: LossFn):
        stats = []
        for micro_batch in self._on_device(micro_batches):
            loss, micro_stats = loss_fn(self._logits(micro_batch), micro_batch)
            loss.backward()
            stats.append(micro_stats)
        return stats

    @torch.no_grad()
    def forward_only(self, micro_batches: list[MicroBatch], fn):
        return [fn(self._logits(m), m) for m in self._on_device(micro_batches)]

    def optimizer_step(self, max_grad_norm):
        params = [p for p in self.model.parameters() if p.grad is not None]
        if max_grad_norm:
            norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        else:
            norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params])) if params else torch.tensor(0.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    def named_full_tensors(self, include_frozen: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
        for name, param in version_parameters(self.model, include_frozen):
            yield name, param.detach().cpu()

    def named_full_tensors_everywhere(self, include_frozen: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
        for name, param in version_parameters(self.model, include_frozen):
            yield name, param.detach()

    @property
    def module(self) -> torch.nn.Module | None:
        return self.model

    def full_module(self) -> torch.nn.Module:
        return self.model

    @property
    def is_weight_sender(self) -> bool:
        return True

    def save_pretrained(self, path: str) -> None:
        self.model.save_pretrained(path)  # a peft model writes its adapter directory

    # --- trainer state (DCP; no_dist: one process, even when a default group exists for something else) ---
    def _manifest(self) -> dict:
        from coati.plugins.state import layout_manifest

        return layout_manifest("single", world_size=1, precision=self.layout.precision)

    def save_state(self, path: str) -> None:
        from coati.plugins.state import save_dcp

        save_dcp(path, self.model, self.optimizer, self._manifest(), no_dist=True)

    def load_state(self, path: str) -> None:
        from coati.plugins.state import load_dcp

        load_dcp(path, self.model, self.optimizer, self._manifest(), no_dist=True)
