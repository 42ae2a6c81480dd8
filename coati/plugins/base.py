"""The protocol every trainer plugin implements (named after ColossalAI's Booster plugins).

A plugin owns the model and optimizer laid out for one parallel scheme (single process, DDP, FSDP2, TP, PP,
ColossalAI hybrid...). The consumer only ever talks to this interface, so algorithms never see the layout.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable, Iterator

import torch

MicroBatch = dict[str, torch.Tensor]
# (logits of the micro-batch, the micro-batch) -> (loss to backpropagate, detached statistics)
LossFn = Callable[[torch.Tensor, MicroBatch], tuple[torch.Tensor, dict[str, torch.Tensor]]]


class TrainerPlugin(ABC):
    @abstractmethod
    def setup(self, model: torch.nn.Module, learning_rate: float, betas: tuple[float, float] = (0.9, 0.99),
              weight_decay: float = 0.0) -> None:
        """Take ownership of ``model`` (full weights on CPU) and build the optimizer for this layout."""

    @abstractmethod
    def forward_backward(self, micro_batches: list[MicroBatch], loss_fn: LossFn) -> list[dict[str, torch.Tensor]]:
        """Forward and backward every micro-batch, accumulating gradients; statistics per micro-batch."""

    @abstractmethod
    def optimizer_step(self, max_grad_norm: float | None) -> float:
        """Clip (when ``max_grad_norm``), step, zero the gradients; returns the pre-clip gradient norm."""

    @abstractmethod
    def named_full_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full (gathered) parameters keyed by HF names; empty on ranks that do not send weights."""

    @property
    @abstractmethod
    def is_weight_sender(self) -> bool:
        """True on the one rank of the trainer group that publishes weights to the inferencers."""

    @property
    def dp_rank(self) -> int:
        return 0

    @property
    def dp_size(self) -> int:
        return 1

    @abstractmethod
    def save_pretrained(self, path: str) -> None:
        """Write the policy as an HF directory (``from_pretrained`` loads it); only the sender writes."""
