"""The protocol every trainer plugin implements (named after ColossalAI's Booster plugins).

A plugin owns the model and optimizer laid out for one parallel scheme (single process, DDP, FSDP2, TP, PP,
ColossalAI hybrid...). The consumer only ever talks to this interface, so algorithms never see the layout.

Multi-rank plugins (everything but ``single``) train inside one *trainer group*: N processes that already
joined one ``torch.distributed`` default process group (gloo on CPU, nccl on GPU; see
``coati.plugins.dist.init_trainer_group``) before ``setup``. The group is laid out as a
``dp x pp x tp`` grid (tp fastest); the ranks of one data-parallel rank (``tp * pp`` of them, the
*model-parallel* ranks) must be given the same micro-batches, different data-parallel ranks different ones.

Collective calls: ``setup``, ``forward_backward``, ``optimizer_step``, ``named_full_tensors`` (iterated to
the end), ``save_pretrained``, ``save_state`` and ``load_state`` must be called by every rank of the group,
in the same order, or the group deadlocks. Every rank passes the same number of ``forward_backward`` calls
per optimizer step, each with at least one micro-batch and (under pipeline parallelism) the same number of
micro-batches on the ranks of one data-parallel rank.

Gradients are *averaged* over data-parallel ranks (DDP semantics): a loss normalised by a rank's own batch
gives the mean of the ranks' losses; normalise by ``global normaliser / dp_size`` to get exactly the loss of
the concatenated batch.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from typing import Callable, Iterator

import torch

from coati.plugins.mesh import TrainerMesh
from coati.parallel.dims import ParallelDims

MicroBatch = dict[str, torch.Tensor]
# (logits of the micro-batch, the micro-batch) -> (loss to backpropagate, detached statistics)
LossFn = Callable[[torch.Tensor, MicroBatch], tuple[torch.Tensor, dict[str, torch.Tensor]]]
# (logits of the micro-batch, the micro-batch) -> anything (forward_only's results, one per micro-batch)
ForwardFn = Callable[[torch.Tensor, MicroBatch], object]


# A micro-batch's layout (coati/layouts/), under this key: an object whose ``logits(model, micro_batch)`` is the
# micro-batch's forward (padded with a logits window, packed, shared prompts...). A plugin that runs the model's own
# forward runs it through ``causal_lm_logits``; pipeline stages take rows that name none.
LAYOUT = "layout"


def takes_logits_to_keep(model: torch.nn.Module) -> bool:
    """Whether ``model``'s forward (under a DDP wrapper or peft's adapters) has HF's ``logits_to_keep``."""
    inner = getattr(model, "module", model)  # DistributedDataParallel
    if hasattr(inner, "get_base_model"):  # peft passes its keywords on to the base model
        inner = inner.get_base_model()
    try:
        return "logits_to_keep" in inspect.signature(inner.forward).parameters
    except (TypeError, ValueError):
        return False


def causal_lm_logits(model: torch.nn.Module, micro_batch: MicroBatch) -> torch.Tensor:
    """The logits of a micro-batch: through the layout it names (``LAYOUT``: the layout's forward, whose logits
    the same layout reads into logprobs), else the model's forward on its padded rows."""
    layout = micro_batch.get(LAYOUT)
    if layout is not None:
        return layout.logits(model, micro_batch)
    return model(input_ids=micro_batch["input_ids"], attention_mask=micro_batch["attention_mask"]).logits


class TrainerPlugin(ABC):
    # Where the model computes (``coati.plugins.dist.trainer_device``: this rank's GPU in an nccl group, else
    # the CPU), decided in ``setup``. Callers hand over CPU micro-batches and get CPU full tensors back; only
    # ``loss_fn`` sees device tensors, so a loss must create its own tensors on the logits' device.
    device: torch.device = torch.device("cpu")

    @abstractmethod
    def setup(self, model: torch.nn.Module, learning_rate: float, betas: tuple[float, float] = (0.9, 0.99),
              weight_decay: float = 0.0, gradient_checkpointing: bool = False) -> None:
        """Take ownership of ``model`` (full fp32 weights on CPU, identical on every rank) and build the optimizer
        (``coati.plugins.optim.make_adamw``: no decay on biases and norms).

        The model (or this rank's part of it) moves to ``device`` before it is wrapped or sharded. Multi-rank
        plugins shard/wrap the model over the default process group here (collective). The layout's
        ``precision`` is the compute dtype (``coati.plugins.precision``); master weights stay fp32.
        ``gradient_checkpointing``: HF activation checkpointing of the decoder layers.
        """

    @abstractmethod
    def forward_backward(self, micro_batches: list[MicroBatch], loss_fn: LossFn) -> list[dict[str, torch.Tensor]]:
        """Forward and backward every micro-batch, accumulating gradients; statistics per micro-batch.

        Each micro-batch's tensors are moved to ``device`` first: ``loss_fn`` sees them there, with full
        (vocabulary-complete) logits; its statistics are returned as it made them (callers take ``float``).
        Under pipeline parallelism it runs on the last stage and its statistics are broadcast (as CPU tensors)
        to the other stages, so every rank returns the same list.
        """

    def forward_only(self, micro_batches: list[MicroBatch], fn: ForwardFn) -> list:
        """``fn(logits, micro_batch)`` of every micro-batch under ``torch.no_grad()``, nothing accumulated (e.g. a
        critic's values before its update); micro-batches on ``device``, as for ``forward_backward``.
        Collective, like ``forward_backward``; layouts whose forward is split over ranks (pipeline stages) do
        not offer it."""
        raise NotImplementedError(f"{type(self).__name__} has no forward-only pass")

    optimizer = None  # the torch optimizer (or a wrapper with ``param_groups``), built in ``setup``

    # Whether the micro-batches of one call may differ in rows and width (token-budget micro-batches, each cut to
    # its own longest row). Pipeline schedules concatenate them into one batch of equal micro-batches: False.
    ragged_micro_batches: bool = True

    def set_learning_rate(self, learning_rate: float) -> None:
        """The learning rate of the next optimizer steps (a schedule sets it before each step)."""
        from coati.plugins.optim import set_learning_rate

        set_learning_rate(self.optimizer, learning_rate)

    @abstractmethod
    def optimizer_step(self, max_grad_norm: float | None) -> float:
        """Clip (when ``max_grad_norm``), step, zero the gradients; returns the pre-clip gradient norm.

        The norm is the one of the full (unsharded, data-parallel-averaged) gradient, equal on every rank.
        """

    @abstractmethod
    def named_full_tensors(self, include_frozen: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
        """Full (gathered) parameters on the CPU keyed by their names (tied weights once); yields only on the
        sender. What a weight version holds: every parameter, or of a model with LoRA adapters only the trained
        ones (``coati.models.lora.version_parameters``; ``include_frozen``: the frozen base too, e.g. to merge).

        Collective for sharded layouts: every rank must iterate it to the end (non-senders yield nothing).
        """

    def named_full_tensors_everywhere(self, include_frozen: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
        """Full parameters on every rank, one at a time (a colocated rank's engine loads each as it comes, so the
        peak is one tensor beyond the engine): the sender's gather, then a broadcast from it. Collective; layouts
        whose gather already leaves the full tensor on every rank yield it directly."""
        from coati.plugins.dist import broadcast_named_tensors

        yield from broadcast_named_tensors(self.named_full_tensors(include_frozen), self.is_weight_sender,
                                           self.device)

    # The trained HF module (a peft model with adapters) on layouts that keep it whole or shard it in place
    # (single, torch DDP/FSDP2, ColossalAI TorchDDP/LowLevelZero); None where it is split into stages or shards.
    module: torch.nn.Module | None = None

    def adapters_off(self):
        """Context in which the trained model's forwards compute as its base model (LoRA adapters switched off):
        the reference model of the KL term, at no memory cost."""
        from coati.models.lora import adapters_off

        return adapters_off(self.module)

    def full_module(self) -> torch.nn.Module | None:
        """The trained HF module itself when this rank holds all of its weights unsharded (one process, DDP):
        a colocated engine can generate with it, no copy and nothing to sync. None for sharded layouts."""
        return None

    @property
    @abstractmethod
    def is_weight_sender(self) -> bool:
        """True on the one rank of the trainer group that publishes weights to the inferencers."""

    # The trainer group's mesh (coati.plugins.mesh): sizes, this rank's coordinates, the sub-groups. Handed in
    # when several plugins share one group (the roles of a trainer group); else built from the default group.
    _mesh: TrainerMesh | None = None
    _owns_mesh: bool = True
    layout: ParallelDims = ParallelDims()

    def _use_mesh(self, mesh: TrainerMesh | None) -> None:
        self._mesh, self._owns_mesh = mesh, mesh is None

    def _resolve_mesh(self) -> TrainerMesh:
        """In ``setup``: this plugin's own mesh of the group as it is now, or the one handed in, which must
        have this plugin's tp/pp sizes."""
        if self._owns_mesh:
            self._mesh = TrainerMesh.build(self.layout)
        elif (self._mesh.tp_size, self._mesh.pp_size) != (self.layout.tp_size, self.layout.pp_size):
            raise ValueError(f"the trainer mesh is tp={self._mesh.tp_size} pp={self._mesh.pp_size} but this plugin's "
                             f"layout is tp={self.layout.tp_size} pp={self.layout.pp_size}; build both from one layout")
        return self._mesh

    @property
    def mesh(self) -> TrainerMesh:
        if self._mesh is None:
            self._mesh = TrainerMesh.build(self.layout)
        return self._mesh

    @property
    def rank(self) -> int:
        """This process's rank in the trainer group."""
        return self.mesh.rank

    @property
    def world_size(self) -> int:
        """Processes in the trainer group (dp_size * tp_size * pp_size)."""
        return self.mesh.world_size

    @property
    def dp_rank(self) -> int:
        return self.mesh.dp_rank

    @property
    def dp_size(self) -> int:
        return self.mesh.dp_size

    @property
    def model_parallel_size(self) -> int:
        """Ranks that share one data-parallel rank's micro-batches (tp_size * pp_size)."""
        return self.mesh.model_parallel_size

    @abstractmethod
    def save_pretrained(self, path: str) -> None:
        """Write the policy as an HF directory (``from_pretrained`` loads it); only the sender writes.

        Collective for sharded layouts (the weights are gathered first).
        """

    @abstractmethod
    def save_state(self, path: str) -> None:
        """Write the trainer state (parameters and optimizer state) into directory ``path`` (it may exist).

        Every rank writes its own shards into the same directory (no gather onto one rank), with a manifest
        ``trainer_state.json`` naming the plugin and layout (``coati.plugins.state``). Collective. RNG states,
        the HF export and an atomic rename of ``path`` are the caller's.
        """

    @abstractmethod
    def load_state(self, path: str) -> None:
        """After ``setup``: restore parameters and optimizer state from ``save_state``'s ``path``, so that the
        next step equals the one of an uninterrupted run. Collective.

        Checkpoints of single and the torch-* plugins load into any of those layouts and colossalai-ddp (DCP
        reshards); ColossalAI checkpoints into the ColossalAI layouts that read them. A layout that cannot
        read a checkpoint raises ``ValueError`` naming both layouts.
        """

    def close(self) -> None:
        """Release what ``setup`` built (process sub-groups, hooks); the default group stays to its owner."""
        self._close_mesh()

    def _close_mesh(self) -> None:
        """A mesh handed in belongs to whoever built it (it may serve other plugins); an own one closes here."""
        if self._owns_mesh and self._mesh is not None:
            self._mesh.close()

    def _on_device(self, micro_batches: list[MicroBatch]) -> list[MicroBatch]:
        from coati.plugins.dist import to_device

        return [to_device(micro_batch, self.device) for micro_batch in micro_batches]
