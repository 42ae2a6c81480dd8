"""One process, no parallelism: the reference layout every other plugin must agree with."""

from __future__ import annotations

from typing import Iterator

import torch

from coati.plugins.base import LossFn, MicroBatch, TrainerPlugin


class SingleProcessPlugin(TrainerPlugin):
    def __init__(self):
        self.model: torch.nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None

    def setup(self, model, learning_rate, betas=(0.9, 0.99), weight_decay=0.0) -> None:
        from coati.plugins.dist import trainer_device

        self.device = trainer_device()
        self.model = model.to(self.device).train()
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, betas=betas,
                                           weight_decay=weight_decay)

    def forward_backward(self, micro_batches: list[MicroBatch], loss_fn: LossFn):
        stats = []
        for micro_batch in self._on_device(micro_batches):
            logits = self.model(input_ids=micro_batch["input_ids"],
                                attention_mask=micro_batch["attention_mask"]).logits
            loss, micro_stats = loss_fn(logits, micro_batch)
            loss.backward()
            stats.append(micro_stats)
        return stats

    @torch.no_grad()
    def forward_only(self, micro_batches: list[MicroBatch], fn):
        return [fn(self.model(input_ids=m["input_ids"], attention_mask=m["attention_mask"]).logits, m)
                for m in self._on_device(micro_batches)]

    def optimizer_step(self, max_grad_norm):
        params = [p for p in self.model.parameters() if p.grad is not None]
        if max_grad_norm:
            norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        else:
            norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params])) if params else torch.tensor(0.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    def named_full_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, param in self.model.named_parameters():
            yield name, param.detach().cpu()

    def named_full_tensors_everywhere(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, param in self.model.named_parameters():
            yield name, param.detach()

    def full_module(self) -> torch.nn.Module:
        return self.model

    @property
    def is_weight_sender(self) -> bool:
        return True

    def save_pretrained(self, path: str) -> None:
        self.model.save_pretrained(path)

    # --- trainer state (DCP; no_dist: one process, even when a default group exists for something else) ---
    def _manifest(self) -> dict:
        from coati.plugins.state import layout_manifest

        return layout_manifest("single", world_size=1)

    def save_state(self, path: str) -> None:
        from coati.plugins.state import save_dcp

        save_dcp(path, self.model, self.optimizer, self._manifest(), no_dist=True)

    def load_state(self, path: str) -> None:
        from coati.plugins.state import load_dcp

        load_dcp(path, self.model, self.optimizer, self._manifest(), no_dist=True)
