"""ColossalAI Booster plugins behind the ``TrainerPlugin`` protocol: TorchDDP, LowLevelZero, HybridParallel.

- ``ddp``: ``TorchDDPPlugin`` (gradients all-reduced on the last micro-batch of each call; ``no_sync`` before).
- ``zero``: ``LowLevelZeroPlugin(stage=1|2)``; parameters stay full on every rank, optimizer states (and with
  stage 2 gradients) are sharded. fp32 is supported; on CPU ``overlap_communication`` is off.
- ``hybrid``: ``HybridParallelPlugin(tp_size, pp_size, zero_stage, precision)``: shardformer TP (Qwen2;
  logits gathered to the full vocabulary, ``parallel_output=False``), pipeline stages run through
  ``booster.execute_pipeline`` (our own Qwen2 policy for transformers 5: ``colossal_policies``), ZeRO 1/2
  over dp (bf16/fp16 only: ColossalAI refuses fp32 ZeRO here).

LoRA (``ddp``, ``zero``): the model arrives with its adapters (``coati.models.lora.add_adapters``, the same as
the torch layouts'), frozen base included, and is boosted whole; the optimizer holds the adapters only, so
LowLevelZero keeps fp32 masters, states and partitions for them alone (under bf16/fp16 it casts the frozen base to
the compute dtype, as it does every working weight). ``module`` is the peft model (``adapters_off``, PEFT saves).

Clipping: the ColossalAI optimizers clip inside ``step`` with ``max_norm`` fixed at construction; the value
``optimizer_step`` receives is written to the optimizer before stepping, and the pre-clip norm it reports
is ColossalAI's (``get_grad_norm``). On CPU, ``colossal_cpu_compat`` is applied first.

Groups: ColossalAI's plugins build their own process groups (``HybridParallelPlugin`` its ``ProcessGroupMesh`` in
its constructor; none takes groups from outside), so they cannot share the trainer mesh's: each ColossalPlugin (each
role) has ColossalAI groups of its own. The sizes come from the layout, this rank's coordinates from the trainer mesh,
and ``setup`` checks that ColossalAI placed the rank where the mesh does.

Weights out: the sender is global rank 0. TP shards are gathered inside each TP group (ColossalAI's
``gather_distributed_param``, vocabulary padding removed); pipeline stages other than the first send their
(TP-gathered) tensors to rank 0 point-to-point. Only the ranks of data-parallel rank 0 with TP rank 0 send.
"""

from __future__ import annotations

import os
from typing import Iterator

import torch
import torch.distributed as dist

from coati.models.lora import is_adapted, load_adapter_weights, save_adapter, version_parameters
from coati.plugins import colossal_cpu_compat
from coati.plugins.base import LossFn, MicroBatch, TrainerPlugin, causal_lm_logits
from coati.plugins.dist import trainer_device, world
from coati.plugins.mesh import TrainerMesh
from coati.plugins.precision import autocast
from coati.parallel.dims import ParallelDims
from coati.plugins.validation import validate_layout
from coati.registry.plugins import PLUGINS


def launch_colossalai() -> list[str]:
    """Prepare ColossalAI in a process whose default group is already up (instead of ``colossalai.launch``,
    which would initialise the group and reseed every RNG): select its accelerator, apply the CPU fixes.

    The accelerator follows ``trainer_device`` rather than ColossalAI's own choice (CUDA whenever it is
    visible): the Booster places the model, and the optimizers their states, on the accelerator's device, and
    a gloo group on a machine with GPUs must stay on the CPU."""
    from colossalai.accelerator import get_accelerator, set_accelerator

    wanted = trainer_device().type
    if get_accelerator().name != wanted:
        set_accelerator(wanted)
    return colossal_cpu_compat.apply()


class ColossalPlugin(TrainerPlugin):
    KINDS = ("ddp", "zero", "hybrid")

    def __init__(self, kind: str, layout: ParallelDims | None = None, max_grad_norm: float = 1.0,
                 mesh: TrainerMesh | None = None):
        if kind not in self.KINDS:
            raise ValueError(f"unknown ColossalAI plugin {kind!r}; choose one of {self.KINDS}")
        self.kind = kind
        self.layout = layout or ParallelDims()
        self.max_grad_norm = max_grad_norm
        self._use_mesh(mesh)
        self.booster = self.plugin = self.model = self.optimizer = self.module = None
        self._hf_names: list[str] = []
        self._owners: dict[str, int] = {}  # pipeline: HF name -> global rank that sends it

    # --- layout ---
    @property
    def tp_size(self) -> int:
        return self.layout.tp_size

    @property
    def pp_size(self) -> int:
        return self.layout.pp_size

    @property
    def ragged_micro_batches(self) -> bool:  # the pipeline schedule takes one batch of equal micro-batches
        return self.pp_size == 1

    @property
    def pp_rank(self) -> int:
        return self.mesh.pp_rank  # ColossalAI's ProcessGroupMesh is (dp, pp, tp), as the trainer mesh

    @property
    def tp_rank(self) -> int:
        return self.mesh.tp_rank

    @property
    def is_weight_sender(self) -> bool:
        return self.rank == 0

    # --- setup ---
    def _make_booster_plugin(self, cpu: bool, model_config):
        from colossalai.booster.plugin import HybridParallelPlugin, LowLevelZeroPlugin, TorchDDPPlugin

        layout = self.layout
        if self.kind == "ddp":
            return TorchDDPPlugin()
        if self.kind == "zero":
            return LowLevelZeroPlugin(stage=layout.zero_stage, precision=layout.precision, max_norm=self.max_grad_norm,
                                      overlap_communication=not cpu)
        kwargs = dict(tp_size=layout.tp_size, pp_size=layout.pp_size, zero_stage=layout.zero_stage,
                      precision=layout.precision, max_norm=self.max_grad_norm, parallel_output=False,
                      enable_all_optimization=False, overlap_communication=not cpu, overlap_p2p=not cpu,
                      enable_metadata_cache=False)
        from coati.plugins.colossal_policies import policy_for

        kwargs.update(custom_policy=policy_for(model_config))
        if layout.pp_size > 1:  # the real micro-batch size is set per forward_backward call (_pipeline_step)
            kwargs.update(microbatch_size=1)
        return HybridParallelPlugin(**kwargs)

    def setup(self, model, learning_rate, betas=(0.9, 0.99), weight_decay=0.0, gradient_checkpointing=False) -> None:
        from colossalai.booster import Booster

        from coati.plugins.optim import enable_gradient_checkpointing, make_adamw

        config = getattr(model, "config", None)
        validate_layout(f"colossalai-{self.kind}", self.layout.on_world(world()[1]), config)
        self._resolve_mesh()
        cpu = bool(launch_colossalai())
        # no move here: the Booster moves the model to the accelerator's device (after sharding, under TP)
        self.device = trainer_device()
        self.config = config
        self._hf_names = [name for name, _ in model.named_parameters()]  # tied weights once, HF order
        self._version_names = {name for name, _ in version_parameters(model)}  # with LoRA: the adapters
        self.plugin = self._make_booster_plugin(cpu, config)
        if self.kind == "hybrid":
            check_same_mesh(self.plugin, self.mesh)
        self.booster = Booster(plugin=self.plugin)
        if gradient_checkpointing:
            enable_gradient_checkpointing(model)
        # TorchDDPPlugin keeps the fp32 model: bf16 is autocast in forward (coati.plugins.precision); the ZeRO and
        # hybrid optimizers keep fp32 masters of their bf16/fp16 working weights themselves
        optimizer = make_adamw(model, learning_rate, betas, weight_decay)
        self.model, self.optimizer, *_ = self.booster.boost(model.train(), optimizer)
        placed = next(iter(self._local_named().values())).device
        if placed != self.device:
            raise RuntimeError(f"ColossalAI placed the model on {placed}, the trainer computes on {self.device}")
        self._index_owners()
        # the (peft) model itself, unsharded and in place: adapters_off flips its layers' switches
        self.module = self.model.unwrap(unwrap_peft=False) if self.kind != "hybrid" else None

    # --- training ---
    def forward_backward(self, micro_batches: list[MicroBatch], loss_fn: LossFn):
        micro_batches = self._on_device(micro_batches)
        if self.pp_size > 1:
            return self._pipeline_step(micro_batches, loss_fn)
        stats = []
        for index, micro_batch in enumerate(micro_batches):
            last = index == len(micro_batches) - 1
            context = self.booster.no_sync(self.model) if (self.kind == "ddp" and not last and self.world_size > 1) \
                else _null()
            with context:
                loss, micro_stats = loss_fn(self._logits(micro_batch), micro_batch)
                self.booster.backward(loss, self.optimizer)
            stats.append(micro_stats)
        return stats

    @torch.no_grad()
    def forward_only(self, micro_batches: list[MicroBatch], fn):
        if self.pp_size > 1:
            raise NotImplementedError("colossalai-hybrid with pipeline stages has no forward-only pass")
        return [fn(self._logits(m), m) for m in self._on_device(micro_batches)]

    def _logits(self, micro_batch: MicroBatch) -> torch.Tensor:
        precision = self.layout.precision if self.kind == "ddp" else "fp32"  # the others cast their weights
        with autocast(self.device, precision):
            return causal_lm_logits(self.model, micro_batch).float()

    def _pipeline_step(self, micro_batches: list[MicroBatch], loss_fn: LossFn):
        """All micro-batches of the call become one pipeline batch; each is a pipeline micro-batch."""
        batch = concat_micro_batches(micro_batches)
        size, total = micro_batches[0]["input_ids"].shape[0], batch["input_ids"].shape[0]
        micro_size = size if (total % size == 0 and total // size >= self.pp_size) else _pick_micro_size(total, self.pp_size)
        schedule = self.plugin.scheduler
        schedule.microbatch_size, schedule.num_microbatches, schedule.last_batch_size = micro_size, total // micro_size, None
        collected: list[dict] = []

        def criterion(outputs, micro_batch):
            loss, micro_stats = loss_fn(outputs.logits.float(), micro_batch)
            # CPU copies: they are pickled to the other stages, where a CUDA tensor would name the sender's GPU
            collected.append({k: v.detach().float().cpu() for k, v in micro_stats.items()})
            return loss * schedule.num_microbatches  # ColossalAI divides each micro-batch's loss by their count

        self.booster.execute_pipeline(iter([batch]), self.model, criterion, self.optimizer, return_loss=True)
        return self._broadcast_stats(collected, total // micro_size)

    def _broadcast_stats(self, collected: list[dict], count: int) -> list[dict]:
        """The last stage's statistics, sent to every stage of its pipeline (one broadcast)."""
        last = self.mesh.last_in("pp")
        payload = [collected if self.rank == last else None]
        group = self.plugin.pp_group
        dist.broadcast_object_list(payload, src=last, group=group)
        return payload[0]

    def optimizer_step(self, max_grad_norm):
        _set_max_norm(self.optimizer, max_grad_norm or 0.0)
        if self.kind == "ddp":
            norm = self._ddp_grad_norm()
            if max_grad_norm:
                from coati.plugins.dist import clip_grads_

                clip_grads_(self.model.parameters(), norm, max_grad_norm)
        self.optimizer.step()
        if self.kind != "ddp":
            norm = float(self.optimizer.get_grad_norm() or 0.0)
        self.optimizer.zero_grad()
        return norm

    def _ddp_grad_norm(self) -> float:
        from coati.plugins.dist import grad_norm_sq

        return float(grad_norm_sq(self.model.parameters())) ** 0.5

    # --- weights out ---
    def _local_named(self):
        # unwrap_peft=False: ColossalAI's peft unwrapping renames the base layers for its checkpoints
        module = self.model.unwrap(unwrap_peft=False) if hasattr(self.model, "unwrap") else self.model
        return dict(module.named_parameters())

    def _index_owners(self) -> None:
        """Which global rank sends each HF-named tensor (pipeline: the stage holding it), with shape/dtype."""
        if self.pp_size == 1:
            return
        local = self._local_named()
        mine = {}
        if self.dp_rank == 0 and self.tp_rank == 0:
            for name in self._hf_names:
                if name in local:
                    mine[name] = self.rank
        everyone: list = [None] * self.world_size
        dist.all_gather_object(everyone, mine)
        for table in everyone:
            for name, entry in table.items():
                self._owners.setdefault(name, entry)
        missing = [name for name in self._hf_names if name not in self._owners]
        if missing:
            raise RuntimeError(f"no pipeline stage holds {missing[:3]}")

    def named_full_tensors(self, include_frozen: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
        local = self._local_named()
        if self.dp_rank != 0:  # data-parallel replicas hold the same weights
            return
        for name in self._hf_names:
            if not include_frozen and name not in self._version_names:
                continue
            if name not in local:  # held by another pipeline stage
                if self.is_weight_sender:
                    payload = [None]
                    dist.recv_object_list(payload, src=self._owners[name])
                    yield name, payload[0]
                continue
            tensor = self._gather(local[name])  # collective inside the TP group
            if self.is_weight_sender:
                yield name, tensor
            elif self.pp_size > 1 and self._owners[name] == self.rank:
                dist.send_object_list([tensor], dst=0)

    def _gather(self, param: torch.Tensor) -> torch.Tensor:
        """Full tensor of one parameter: TP shards gathered, vocabulary padding cut off (never in place)."""
        if self.kind != "hybrid":
            return param.detach().cpu()
        from colossalai.checkpoint_io.utils import gather_distributed_param

        full = gather_distributed_param(param, keep_vars=False) if self.tp_size > 1 else param
        padded = next((t for t in (full, param) if hasattr(t, "_padding_dim")), None)
        full = torch.Tensor(full.data) if isinstance(full, torch.nn.Parameter) else full.data
        if padded is not None:  # ColossalAI's to_unpadded_tensor would unpad the live parameter itself
            full = full.narrow(padded._padding_dim, 0, padded._origin_length)
        return full.detach().clone().cpu()

    def save_pretrained(self, path: str) -> None:
        state = dict(self.named_full_tensors())
        if self.is_weight_sender:
            from coati.plugins.torch_native import save_hf

            if is_adapted(self.module):
                save_adapter(self.module, state, path)
            else:
                save_hf(_HFConfigHolder(self.config), state, path)
        if self.world_size > 1:
            dist.barrier()

    # --- trainer state (ColossalAI's sharded Booster checkpoint; colossalai-ddp also reads torch-dcp ones) ---
    def _manifest(self) -> dict:
        from coati.plugins.state import layout_manifest

        return {**layout_manifest(f"colossalai-{self.kind}", self.world_size, tp_size=self.tp_size,
                                  pp_size=self.pp_size, zero_stage=self.layout.zero_stage,
                                  precision=self.layout.precision),
                "adapters": is_adapted(self.module)}

    def save_state(self, path: str) -> None:
        """Model and optimizer in ColossalAI's sharded format (``booster.save_model/save_optimizer(shard=True)``,
        into ``path/model`` and ``path/optimizer``): full (TP-gathered, unpadded) tensors by HF name, optimizer
        states by parameter index. Each pipeline stage writes its own files, from its first dp/tp rank; TP and
        ZeRO shards are gathered there one tensor at a time. With LoRA ``path/model`` holds the adapters alone
        (``booster.save_lora_as_pretrained``), as the torch layouts' states leave out the frozen base."""
        from coati.plugins.state import COLOSSAL_FORMAT, write_manifest

        _fix_padded_vocab_checkpoints()
        os.makedirs(path, exist_ok=True)
        if is_adapted(self.module):  # ColossalAI's LoRA save: a PEFT directory of the adapters, not the frozen base
            self.booster.save_lora_as_pretrained(self.model, os.path.join(path, "model"), use_safetensors=True)
        else:
            self.booster.save_model(self.model, os.path.join(path, "model"), shard=True)
        self.booster.save_optimizer(self.optimizer, os.path.join(path, "optimizer"), shard=True)
        if self.rank == 0:
            write_manifest(path, {"format": COLOSSAL_FORMAT, **self._manifest()})
        if self.world_size > 1:
            dist.barrier()

    def load_state(self, path: str) -> None:
        from coati.plugins.state import DCP_FORMAT, incompatible, load_dcp, read_manifest

        requested = self._manifest()
        saved = read_manifest(path, requested)
        if saved.get("format") == DCP_FORMAT and self.kind == "ddp" and self.layout.precision == "fp32":
            # TorchDDPPlugin is torch DDP around the HF model: the torch layouts' checkpoints load as for torch-ddp
            load_dcp(path, self.module, self.optimizer.optim, requested)
            return
        reason = colossal_mismatch(saved, requested)
        if reason:
            raise incompatible(path, saved, requested, reason)
        _fix_padded_vocab_checkpoints()
        if is_adapted(self.module):
            load_adapter_weights(self.module, os.path.join(path, "model"))
            if hasattr(self.model, "update_master_params"):  # LowLevelZero: its fp32 masters from the loaded weights
                self.model.update_master_params()
        else:
            self.booster.load_model(self.model, os.path.join(path, "model"))
        self.booster.load_optimizer(self.optimizer, os.path.join(path, "optimizer"))

    def close(self) -> None:
        self.booster = self.plugin = self.model = self.optimizer = self.module = None
        self._close_mesh()


def check_same_mesh(hybrid, mesh: TrainerMesh) -> None:
    """HybridParallelPlugin lays out its own ProcessGroupMesh (it takes no groups from outside); the micro-batch
    shares and the weight senders follow the trainer mesh, so the two must give this rank the same place."""
    theirs = tuple(hybrid.pg_mesh.coordinate(axis) for axis in (hybrid.dp_axis, hybrid.pp_axis, hybrid.tp_axis))
    ours = (mesh.dp_rank, mesh.pp_rank, mesh.tp_rank)
    if theirs != ours:
        raise RuntimeError(f"ColossalAI placed rank {mesh.rank} at (dp, pp, tp) = {theirs}, the trainer mesh at {ours}")


def colossal_mismatch(saved: dict, requested: dict) -> str | None:
    """Why ColossalAI cannot resume ``saved`` (a manifest) in the ``requested`` layout exactly; None when it can.

    Its checkpoints hold layout-free tensors (full, unpadded, by HF name; optimizer states by parameter index),
    and tests/plugins/test_state.py resumes across ddp, zero, hybrid tp and hybrid pp exactly, except from a
    HybridParallel checkpoint without pipeline: it stores a tied embedding once (no ``lm_head.weight``), so
    TorchDDP/LowLevelZero refuse it (strict load) and a pipeline's last stage silently keeps its initial head.
    """
    from coati.plugins.state import COLOSSAL_FORMAT, DCP_FORMAT

    if saved.get("format") != COLOSSAL_FORMAT:
        extra = " (colossalai-ddp in fp32 reads it)" if saved.get("format") == DCP_FORMAT else ""
        return f"it is a {saved.get('format')!r} checkpoint, ColossalAI plugins read {COLOSSAL_FORMAT!r} ones{extra}"
    if saved["precision"] != requested["precision"]:
        return "the precisions differ"
    if saved.get("adapters", False) != requested["adapters"]:
        return "one holds LoRA adapters (--lora-rank), the other full weights"
    writer = PLUGINS.get(saved["plugin"])  # its row says how it stores a tied head, not its name
    if writer is not None and writer.ties_head_once_without_pp and saved["pp_size"] == 1 and \
            (requested["plugin"] != saved["plugin"] or requested["pp_size"] > 1):
        return (f"a {saved['plugin']} checkpoint without pipeline stores tied embeddings once (no lm_head.weight); "
                f"only {saved['plugin']} with pp_size 1 reads it")
    return None


def _fix_padded_vocab_checkpoints() -> None:
    """Two ColossalAI 0.5.0 HybridParallel checkpoint bugs with vocabularies padded for TP / tied heads (any
    device; applied once, to its checkpoint module only):

    - TP optimizer states: ``search_tp_partition_dim`` asserts a state is exactly ``tp_size`` shards of the
      original shape, which a padded vocabulary (101 rows -> 2 x 64) is not ("The parameter isn't evenly
      distributed among tensor parallel group"); the gather/shard code around it already unpads/pads, so a
      padded partition is accepted.
    - Padded parameters without TP (the pipeline's ``PaddingEmbedding``/``PaddingLMHead``): the model save's
      ``to_unpadded_tensor`` on a detached parameter fails ("'Tensor' object has no attribute
      '_unpad_detach'"); it now returns an unpadded copy and never touches the tensor it is given.
    """
    from colossalai.checkpoint_io import hybrid_parallel_checkpoint_io as hybrid_io

    if getattr(hybrid_io.search_tp_partition_dim, "_coati_padded", False):
        return

    def search_tp_partition_dim(current_shape, original_shape, tp_size):
        for dim, length in enumerate(original_shape):
            if length > current_shape[dim]:
                if not (tp_size - 1) * current_shape[dim] < length <= tp_size * current_shape[dim]:
                    raise AssertionError(f"{tuple(original_shape)} is not {tp_size} shards of {tuple(current_shape)}")
                return dim
        return None

    def to_unpadded_tensor(tensor):
        if not hasattr(tensor, "_padding_dim"):
            return tensor
        return tensor.data.narrow(tensor._padding_dim, 0, tensor._origin_length).clone()

    search_tp_partition_dim._coati_padded = True
    hybrid_io.search_tp_partition_dim = search_tp_partition_dim
    hybrid_io.to_unpadded_tensor = to_unpadded_tensor


class _HFConfigHolder:
    def __init__(self, config):
        self.config = config


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _set_max_norm(optimizer, value: float) -> None:
    inner = optimizer
    for attribute in ("max_norm", "_clip_grad_norm"):
        for target in (inner, getattr(inner, "optim", None)):
            if target is not None and isinstance(getattr(target, attribute, None), (int, float)):
                setattr(target, attribute, value)


def _pick_micro_size(total: int, stages: int) -> int:
    for count in range(stages, total + 1):
        if total % count == 0:
            return total // count
    raise ValueError(f"a pipeline of {stages} stages needs at least {stages} samples per call (got {total})")


def concat_micro_batches(micro_batches: list[MicroBatch]) -> MicroBatch:
    """One batch from micro-batches; per-token tensors are right-padded with zeros to the widest."""
    keys = micro_batches[0].keys()
    out = {}
    for key in keys:
        tensors = [mb[key] for mb in micro_batches]
        if tensors[0].dim() >= 2:
            width = max(t.shape[1] for t in tensors)
            tensors = [torch.nn.functional.pad(t, (0, width - t.shape[1])) if t.shape[1] < width else t
                       for t in tensors]
        out[key] = torch.cat(tensors)
    return out
