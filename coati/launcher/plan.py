"""``--dry-run``: the run's plan without starting an actor: where each actor goes, its threads, its memory estimate
(coati/cluster/memory.py) and whether it fits the device it lands on.

The cluster is the one described by ``--dry-run-cluster NODESxGPUSxGB[xCPUS]`` (GB: each GPU's memory; with 0
GPUs the node's RAM), else the Ray cluster the run would join (RAY_ADDRESS / --master_address), else this
machine as the local cluster the run would start. Placement follows coati/cluster/placement.py: the trainer
group packed onto whole nodes first (consecutive ranks on a node), then each inferencer's bundle first-fit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from coati.cluster.memory import (
    CPU_RUNTIME,
    DTYPE_BYTES,
    GiB,
    ModelShape,
    MemoryLayout,
    colocated_memory,
    inferencer_memory,
    kv_bytes_per_token,
    publish_bytes,
    trainer_memory,
)
from coati.cluster.placement import plan as placement_plan
from coati.cluster.placement import shortfall
from coati.cluster.schedule import node_thread_budgets
from coati.utils.machine import usable_cores

GPU_USABLE = 0.95  # of a GPU's memory the trainer may fill (the CUDA context and the allocator's slack take the rest)
SPEC = re.compile(r"^(\d+)x(\d+)x(\d+(?:\.\d+)?)(?:x(\d+))?$")


class PlanError(ValueError):
    """One line: what does not fit, and the fix."""


@dataclass
class Node:
    gpus: int
    cpus: int
    memory: float  # bytes: each GPU's memory on a GPU node, the node's RAM on a CPU node


@dataclass
class Actor:
    name: str
    node: int
    units: list[int] = field(default_factory=list)  # GPU indices on its node (GPU clusters)
    threads: int = 0
    memory: dict = field(default_factory=dict)


def parse_cluster(text: str) -> list[Node]:
    """``4x8x80``: 4 nodes of 8 GPUs with 80 GB each (96 CPUs unless a 4th number says); ``1x0x24x2``: one
    CPU node of 24 GB RAM and 2 CPUs."""
    match = SPEC.match(text.strip())
    if not match:
        raise PlanError(f"--dry-run-cluster {text!r}: expected NODESxGPUSxGB[xCPUS], e.g. 4x8x80 (4 nodes, 8 GPUs "
                        f"of 80 GB each) or 1x0x24x2 (one CPU node, 24 GB RAM, 2 cores)")
    nodes, gpus, gb, cpus = int(match[1]), int(match[2]), float(match[3]), match[4]
    return [Node(gpus, int(cpus) if cpus else (96 if gpus else 1), gb * 1e9) for _ in range(nodes)]


def this_machine(actors: int) -> list[Node]:
    """This machine as the local cluster ``init_ray`` would start (a CPU slot per actor at least)."""
    import psutil
    import torch

    if torch.cuda.is_available():
        memory = min(torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count()))
        return [Node(torch.cuda.device_count(), usable_cores(), memory)]
    return [Node(0, max(actors, usable_cores()), psutil.virtual_memory().total)]


def running_cluster(address: str, source: str, ray_dir: str | None = None) -> list[Node]:
    """The alive nodes of the Ray cluster at ``address`` (probed, then joined as a driver; no actor is started):
    connect.ClusterError in seconds when no head answers there."""
    import ray

    from coati.cluster.connect import probe

    if address != "auto" and "://" not in address:
        probe(address, source, ray_dir)
    ray.init(address=address, include_dashboard=False, logging_level="ERROR")
    try:
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        return [Node(int(n["Resources"].get("GPU", 0)), int(n["Resources"].get("CPU", 1)),
                     n["Resources"].get("memory", 0.0) if not n["Resources"].get("GPU") else 80e9) for n in nodes]
    finally:
        ray.shutdown()


def place(config, nodes: list[Node]) -> tuple[list[Actor], str]:
    """Every actor's node and GPUs (trainer ranks packed first, then inferencers, then the -ei evaluator) and
    the unit ("GPU"/"CPU"); PlanError when the cluster cannot hold the bundles."""
    p = config.parallel
    totals = {"GPU": float(sum(n.gpus for n in nodes)), "CPU": float(sum(n.cpus for n in nodes))}
    plan = placement_plan(p.num_inferencers, p.producer_tensor_parallel_size, p.num_trainers,
                          config.run.eval_interval > 0 and not p.colocate, totals)
    problem = shortfall(plan, totals, [{"GPU": float(n.gpus), "CPU": float(n.cpus)} for n in nodes])
    if problem:
        raise PlanError(problem)
    free = [n.gpus if plan.unit == "GPU" else n.cpus for n in nodes]
    actors = []
    for name, bundle in plan.bundles():
        need = int(bundle[plan.unit])
        index = next(i for i, left in enumerate(free) if left >= need)
        start = (nodes[index].gpus if plan.unit == "GPU" else nodes[index].cpus) - free[index]
        free[index] -= need
        actors.append(Actor(name, index, list(range(start, start + need)) if plan.unit == "GPU" else []))
    return actors, plan.unit


def assign_threads(config, actors: list[Actor], nodes: list[Node]) -> None:
    producers = [a.node for a in actors if a.name.startswith("inferencer")]
    trainers = [a.node for a in actors if a.name.startswith("trainer")]
    cores = {i: max(1, n.cpus) for i, n in enumerate(nodes)}
    producer_threads, trainer_threads = node_thread_budgets(cores, producers, trainers, config.schedule.is_async)
    for actor, threads in zip([a for a in actors if a.name.startswith("inferencer")], producer_threads):
        actor.threads = threads
    for actor, threads in zip([a for a in actors if a.name.startswith("trainer")], trainer_threads):
        actor.threads = threads


def _dtype_name(placement) -> str:
    return {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}[placement.vllm_dtype]


def estimate(config, shape: ModelShape, actors: list[Actor], unit: str, nodes: list[Node]) -> None:
    """Fill every actor's memory components (bytes) for the device it landed on."""
    from coati.utils.device import device_rule

    p, batch, on_cpu = config.parallel, config.batch, unit == "CPU"
    gpus = () if on_cpu else (0,)
    lora = config.model.lora
    adapters = shape.adapter_params(lora.lora_rank, lora.targets) if lora.enabled else 0
    layout = MemoryLayout(p.plugin, p.tensor_parallel_size, p.pipeline_parallel_size, p.dp_size, p.zero_stage,
                           p.precision, config.algo.optim.gradient_checkpointing, adapters)
    seq = config.data.max_prompt_tokens + config.sampling.max_new_tokens
    micro = min(batch.train_microbatch_size, batch.train_batch_size * batch.num_generations)
    # with LoRA the reference is the policy with its adapters off: no second model
    uses_reference = (config.algo.loss.kl_loss_coef > 0 or config.algo.uses_critic) and not lora.enabled
    reference = DTYPE_BYTES[_dtype_name(device_rule(gpus, p.backend, "reference", p.model_dtype, p.precision))]
    engine = _dtype_name(device_rule(gpus, p.backend, "producer", p.model_dtype, p.precision))

    def engine_memory(node: int, trainer: dict | None = None) -> dict:
        ptp = p.producer_tensor_parallel_size if not on_cpu else 1
        weights = DTYPE_BYTES[engine] * shape.params / ptp
        kv = p.vllm_kv_cache_gb * GiB if on_cpu else p.vllm_gpu_memory_utilization * nodes[node].memory - weights
        if trainer is not None and not on_cpu:  # colocated: vLLM's share of the GPU holds the trainer's part too
            kv -= trainer.get("weights", 0.0) + trainer.get("optimizer", 0.0) * (not p.offload_optimizer)
        return inferencer_memory(shape, p.backend, engine, ptp, kv, batch.inference_microbatch_size *
                                 batch.num_generations, seq, config.sampling.max_new_tokens, on_cpu)

    for actor in actors:
        if actor.name.startswith("trainer"):
            memory = trainer_memory(shape, layout, micro, seq, reference if uses_reference else 0, on_cpu)
            if config.algo.uses_critic:  # a second trained model of the policy's shape, same layout
                memory["critic"] = sum(v for k, v in memory.items() if k in ("weights", "gradients", "optimizer"))
            if actor.name == "trainer rank 0" and on_cpu and not p.colocate:  # the sender's host copies
                version = adapters if config.engine_adapters is not None else None  # LoRA: the adapters alone
                memory["publish"] = publish_bytes(shape, p.weight_sync, p.weight_sync_bucket_mb, params=version)
            if p.colocate:  # the peak of either phase, not their sum
                memory = colocated_memory(memory, engine_memory(actor.node, memory), p.engine_is_policy,
                                          p.offload_optimizer and not on_cpu, p.backend_spec.sleeps and not on_cpu)
        else:
            memory = engine_memory(actor.node)
        memory.pop("total", None)
        if p.colocate and actor.name.startswith("trainer"):
            memory["total"] = max(memory.values())
        else:
            memory["total"] = sum(memory.values())
        actor.memory = memory


def check_fit(config, shape: ModelShape, actors: list[Actor], unit: str, nodes: list[Node]) -> str | None:
    """One line naming the first actor (or node) that does not fit, with the fix; None when all fit."""
    p = config.parallel
    if unit == "GPU":
        for actor in actors:
            limit = nodes[actor.node].memory
            if actor.name.startswith("trainer") and actor.memory["total"] > GPU_USABLE * limit:
                return (f"{actor.name} needs {actor.memory['total'] / GiB:.1f} GiB ({_parts(actor.memory)}) on a "
                        f"{limit / GiB:.0f} GiB GPU: raise -tp/-pp or -zero, or lower -tmbs/-mnt")
            if not actor.name.startswith("trainer") and p.backend_spec.kv_cache_budget:
                need = kv_bytes_per_token(shape, DTYPE_BYTES["bf16"]) * (config.data.max_prompt_tokens +
                                                                          config.sampling.max_new_tokens)
                if actor.memory["kv_cache"] < need:
                    return (f"{actor.name}: vLLM's weights ({actor.memory['weights'] / GiB:.1f} GiB per GPU) leave "
                            f"{max(actor.memory['kv_cache'], 0) / GiB:.2f} GiB of KV cache under "
                            f"--vllm-gpu-memory-utilization {p.vllm_gpu_memory_utilization}, less than one "
                            f"{config.data.max_prompt_tokens}+{config.sampling.max_new_tokens}-token sequence "
                            f"needs: raise -ptp or the utilization")
        return None
    for index, node in enumerate(nodes):
        here = [a for a in actors if a.node == index]
        total = sum(a.memory["total"] for a in here) + (3 * CPU_RUNTIME if index == 0 else 0)  # driver, buffer, store
        if total > node.memory:
            return (f"node {index} needs {total / GiB:.1f} GiB for {len(here)} actors (and the driver, buffer and "
                    f"weight store) but has {node.memory / GiB:.1f} GiB: lower -t/-i, raise -zero, lower -tmbs/-mnt "
                    f"or --vllm-kv-cache-gb, or add nodes")
    return None


def _parts(memory: dict) -> str:
    return ", ".join(f"{k} {v / GiB:.1f}" for k, v in memory.items() if k != "total" and v)


def _generators(p) -> str:
    if not p.colocate:
        return f"{p.num_inferencers} {p.backend} inferencer(s), -ptp {p.producer_tensor_parallel_size}"
    engine = "the trained module itself" if p.engine_is_policy else f"its own {p.backend} engine"
    return f"colocated: every trainer rank generates with {engine}; per rank the larger phase counts, not the sum"


def render(config, shape: ModelShape, actors: list[Actor], unit: str, nodes: list[Node]) -> list[str]:
    p, b = config.parallel, config.batch
    gpu_text = f"{nodes[0].gpus} GPUs of {nodes[0].memory / 1e9:.0f} GB" if unit == "GPU" else \
        f"{nodes[0].cpus} CPUs, {nodes[0].memory / GiB:.1f} GiB RAM"
    lines = [(f"plan: {len(nodes)} node(s) x {gpu_text}; model {shape.params / 1e9:.2f}B parameters "
             f"({shape.layers} layers, hidden {shape.hidden}, vocab {shape.vocab})"),
             (f"trainer group: {p.plugin_name}, -t {p.num_trainers} = TP {p.tensor_parallel_size} x PP "
              f"{p.pipeline_parallel_size} x DP {p.dp_size}, -zero {p.zero_stage}, {p.precision}; {_generators(p)}"),
             (f"activations: micro-batches of {min(b.train_microbatch_size, b.train_batch_size * b.num_generations)}"
              f" samples x {config.data.max_prompt_tokens}+{config.sampling.max_new_tokens} tokens (-tmbs, -mpt + "
              f"-mnt: the longest a batch can be)"
              + ("; gradient checkpointing keeps each layer's input only" if config.algo.optim.gradient_checkpointing
                 else "")),
             f"{'actor':<16} {'node':>4}  {'where':<14} {'thr':>3}  {'GiB':>6}  memory (GiB)"]
    for actor in actors:
        where = f"GPU {','.join(map(str, actor.units))}" if actor.units else "1 CPU slot"
        lines.append(f"{actor.name:<16} {actor.node:>4}  {where:<14} {actor.threads or '-':>3}  "
                     f"{actor.memory['total'] / GiB:>6.1f}  {_parts(actor.memory)}")
    return lines


def build_plan(config, cluster: str | None = None) -> tuple:
    """(the config with the one-GPU colocation default decided, the line that says so or None, the model's shape,
    every actor placed with threads and memory, the unit, the nodes); PlanError when the flags or the cluster
    description are wrong or the bundles cannot be placed."""
    from coati.cluster.connect import cluster_address
    from coati.config.colocation import choose_colocation
    from coati.rollout.reward_model import read_model_config

    model_config, problem = read_model_config(config.model.path, "-m/--model", "pass an HF model directory")
    if problem:
        raise PlanError(problem)
    shape = ModelShape.from_config(model_config)
    p = config.parallel
    if cluster:
        nodes = parse_cluster(cluster)
    else:
        address, source = cluster_address(config.run.master_address)
        nodes = (running_cluster(address, source, config.run.ray_dir) if address
                 else this_machine(p.num_trainers + p.num_inferencers))
    config, line = choose_colocation(config, sum(node.gpus for node in nodes))
    actors, unit = place(config, nodes)
    assign_threads(config, actors, nodes)
    estimate(config, shape, actors, unit, nodes)
    return config, line, shape, actors, unit, nodes


def dry_run(config, cluster: str | None = None) -> tuple[list[str], str | None]:
    """The plan's lines and, when it cannot run, the one error line (PlanError for bad input)."""
    config, line, shape, actors, unit, nodes = build_plan(config, cluster)
    lines = ([line] if line else []) + render(config, shape, actors, unit, nodes)
    error = check_fit(config, shape, actors, unit, nodes)
    lines.append(f"does not fit: {error}" if error else "fits: every actor's estimate is within its device's memory")
    return lines, error
