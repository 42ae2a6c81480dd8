"""Joining a trainer group, the device a trainer computes on, and the helpers every torch.distributed plugin
shares (norms, clipping, gathers)."""

from __future__ import annotations

import datetime
import os
import sys

import torch
import torch.distributed as dist


def gpu_granted() -> bool:
    """Whether this process may compute on a CUDA GPU: CUDA is visible and, inside a Ray actor, Ray gave the
    actor a GPU. Ray no longer blanks CUDA_VISIBLE_DEVICES for an actor that asked for no GPU (ray-project/ray
    #54868; Ray 2.60 here), so visibility alone would put CPU-only actors on GPUs other actors reserved."""
    if not torch.cuda.is_available():
        return False
    ray = sys.modules.get("ray")  # a process that never imported Ray is not one of its actors
    if ray is not None and ray.is_initialized():
        context = ray.get_runtime_context()
        if context.get_actor_id() is not None:
            return bool(context.get_accelerator_ids().get("GPU"))
    return True


def default_backend() -> str:
    return "nccl" if gpu_granted() else "gloo"


def trainer_device() -> torch.device:
    """The device a trainer plugin keeps its model on and feeds its micro-batches to; the one rule for every
    layout. In a trainer group the backend decides: nccl reduces only CUDA tensors (this rank's GPU, which
    ``init_trainer_group`` made current), gloo runs on the CPU even where GPUs are visible. Without a group
    (the single layout in its own process) the GPU when this process was given one."""
    on_gpu = _group_uses_nccl() if dist.is_available() and dist.is_initialized() else gpu_granted()
    return torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")


def _group_uses_nccl() -> bool:
    return "nccl" in dist.get_backend()  # also "cpu:gloo,cuda:nccl", which reduces CUDA tensors with nccl


def to_device(micro_batch: dict, device: torch.device) -> dict:
    """``micro_batch`` with its tensors on ``device`` (the same tensors when they are already there)."""
    return {key: value.to(device) if isinstance(value, torch.Tensor) else value for key, value in micro_batch.items()}


def init_trainer_group(rank: int, world_size: int, master_addr: str = "127.0.0.1", master_port: int = 29506,
                       backend: str | None = None, timeout_s: float = 600.0) -> None:
    """Make this process rank ``rank`` of a ``world_size`` trainer group (the default process group).

    Every member calls it with the same address/port; rank 0 hosts the rendezvous store. The environment
    variables torch and ColossalAI read (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) are set too.
    """
    if dist.is_initialized():
        if dist.get_world_size() != world_size or dist.get_rank() != rank:
            raise RuntimeError(f"torch.distributed is already initialised as rank {dist.get_rank()} of "
                               f"{dist.get_world_size()}, not {rank} of {world_size}")
        return
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=os.environ.get("LOCAL_RANK", str(rank)),
                      LOCAL_WORLD_SIZE=os.environ.get("LOCAL_WORLD_SIZE", str(world_size)),
                      MASTER_ADDR=master_addr, MASTER_PORT=str(master_port))
    backend = backend or default_backend()
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
    dist.init_process_group(backend=backend, init_method=f"tcp://{master_addr}:{master_port}", rank=rank,
                            world_size=world_size, timeout=datetime.timedelta(seconds=timeout_s))


def world() -> tuple[int, int]:
    """(rank, world size) of the default group; (0, 1) when torch.distributed is not initialised."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def device_type() -> str:
    """Where the trainer group's collectives need their tensors (``trainer_device``'s rule inside a group)."""
    return "cuda" if dist.is_initialized() and _group_uses_nccl() else "cpu"


def is_dtensor(tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The full value of a (possibly DTensor-sharded) tensor: collective over the DTensor's mesh."""
    tensor = tensor.detach()
    return tensor.full_tensor() if is_dtensor(tensor) else tensor


def grad_norm_sq(params) -> torch.Tensor:
    """Squared L2 norm (float64) of the gradients of ``params``; DTensor gradients are reduced over their meshes."""
    plain, sharded = [], []
    for param in params:
        if param.grad is not None:
            (sharded if is_dtensor(param.grad) else plain).append(param.grad)
    total = torch.zeros((), dtype=torch.float64)
    if plain:
        norms = torch._foreach_norm(plain)
        # one device-to-host copy for all of them (not one per parameter)
        total = total + torch.stack([n.double() for n in norms]).pow(2).sum().cpu()
    for grad in sharded:
        norm = torch.linalg.vector_norm(grad.float()).full_tensor()
        total = total + norm.to(torch.float64).cpu() ** 2
    return total


def clip_grads_(params, total_norm: float, max_norm: float, eps: float = 1e-6) -> None:
    """torch.nn.utils.clip_grad_norm_'s scaling with a norm computed elsewhere (sharded/pipelined grads)."""
    coef = max_norm / (total_norm + eps)
    if coef < 1.0:
        grads = [param.grad for param in params if param.grad is not None]
        plain = [g for g in grads if not is_dtensor(g)]
        if plain:
            torch._foreach_mul_(plain, coef)
        for grad in grads:
            if is_dtensor(grad):
                grad.mul_(coef)


def data_parallel_normaliser(local: float, plugin) -> float:
    """The loss normaliser to use on this rank so that data-parallel-averaged gradients equal the gradient of
    the concatenated batch of all data-parallel ranks: (sum of the dp ranks' own normalisers) / dp_size.

    ``local``: this rank's normaliser for its own batch (e.g. ``batch_normaliser`` of its action masks).
    Collective over the trainer group (model-parallel peers hold the same batch, hence the same value).
    """
    if plugin.world_size == 1:
        return local
    total = torch.tensor([local], dtype=torch.float64, device=device_type())
    dist.all_reduce(total)
    return max(float(total) / plugin.model_parallel_size / plugin.dp_size, 1.0 / plugin.dp_size)


def all_reduce_stats(totals: dict[str, float], mesh, summed=(), maxima=()) -> dict[str, float]:
    """One step's statistics over the whole trainer group (``mesh``: a TrainerMesh, or a plugin's sizes).

    Each rank's normalised statistic is its share of the global value times dp (losses are normalised by the
    global normaliser / dp), so the global value is the mean over data-parallel ranks; names in ``summed``
    are counts (summed over dp ranks), names in ``maxima`` the largest over all ranks. Model-parallel peers
    hold equal values: the sum over all ranks is divided by tp * pp. Collective over the default group.
    """
    if mesh.world_size == 1 or not totals:
        return totals
    names = sorted(name for name in totals if name not in maxima)
    values = torch.tensor([totals[name] for name in names], dtype=torch.float64, device=device_type())
    dist.all_reduce(values)
    values = values.cpu() / mesh.model_parallel_size
    out = {name: float(value) if name in summed else float(value) / mesh.dp_size for name, value in zip(names, values)}
    peaks = sorted(name for name in totals if name in maxima)
    if peaks:
        peak = torch.tensor([totals[name] for name in peaks], dtype=torch.float64, device=device_type())
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
        out.update({name: float(value) for name, value in zip(peaks, peak.cpu())})
    return out


def agree_max(value: int) -> int:
    """The largest of every rank's ``value`` (e.g. micro-batches per call, which every rank must make alike).
    Collective over the default group; without one, ``value`` itself."""
    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        return value
    tensor = torch.tensor([value], dtype=torch.int64, device=device_type())
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return int(tensor.cpu()[0])


def broadcast_named_tensors(items, is_sender: bool, device: torch.device, src: int = 0):
    """Yield on every rank the (name, tensor) pairs that ``items`` yields on the sender (global rank ``src``),
    one tensor at a time: the names, shapes and dtypes first (one object broadcast), then each tensor. Every
    rank must iterate it to the end; ``items`` is drained on every rank (its gathers are collective too).
    Without a process group it is ``items`` itself."""
    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        yield from items
        return
    sent = list(items)  # empty on non-senders, which still take part in the gathers
    header = [[(name, tuple(t.shape), t.dtype) for name, t in sent] if is_sender else None]
    dist.broadcast_object_list(header, src=src)
    on = device if _group_uses_nccl() else torch.device("cpu")  # nccl moves device tensors only
    for index, (name, shape, dtype) in enumerate(header[0]):
        tensor = sent[index][1].to(on) if is_sender else torch.empty(shape, dtype=dtype, device=on)
        dist.broadcast(tensor, src=src)
        yield name, tensor

