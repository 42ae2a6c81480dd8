"""One typed configuration tree for a run, and the start-up checks that reject impossible combinations.

Every check raises ``ConfigError`` with one line that names the problem and the fix, before any actor,
model or Ray cluster is started.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field

from coati.distributed.inference_backend import SamplingParams
from coati.distributed.loss import LOSS_VARIATIONS, PolicyLossConfig
from rewards import REWARD_TYPES, STOP_STRINGS

ALGOS = ("GRPO", "DAPO", "PG")
BACKENDS = ("transformers", "vllm")


class ConfigError(ValueError):
    """An impossible or missing setting; the message says which flag to change and how."""


@dataclass(frozen=True)
class ModelConfig:
    path: str
    is_embedded_demo: bool = False


@dataclass(frozen=True)
class DataConfig:
    train_path: str
    eval_paths: dict[str, str]  # task name -> jsonl
    reward_type: str = "boxed"
    system_prompt: str = ""
    max_prompt_tokens: int = 512


@dataclass(frozen=True)
class ParallelConfig:
    num_inferencers: int = 1
    num_trainers: int = 1
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    zero_stage: int = 0
    producer_tensor_parallel_size: int = 1
    backend: str = "transformers"
    plugin: str = "single"

    @property
    def dp_size(self) -> int:
        return self.num_trainers // (self.tensor_parallel_size * self.pipeline_parallel_size)


@dataclass(frozen=True)
class BatchConfig:
    num_generations: int = 8  # G
    inference_batch_size: int = 64  # prompts per producer round
    inference_microbatch_size: int = 64  # prompts per generate call
    train_batch_size: int = 32  # prompts per optimizer step per data-parallel rank
    train_minibatch_size: int = 32  # prompts pulled from the buffer at a time
    train_microbatch_size: int = 256  # samples per forward/backward


@dataclass(frozen=True)
class AlgoConfig:
    name: str = "GRPO"
    learning_rate: float = 3e-4
    max_grad_norm: float = 1.0
    loss: PolicyLossConfig = PolicyLossConfig()


@dataclass(frozen=True)
class RunConfig:
    project: str = "demo"
    num_episodes: int = 1
    seed: int = 42
    save_dir: str = "runs"
    save_interval: int = 0  # 0: save only at the end
    eval_interval: int = 0  # 0: evaluate only before and after training
    eval_save_dir: str | None = None
    rollout_save_dir: str | None = None
    ray_dir: str | None = None
    master_address: str | None = None
    master_port: int = 29506
    progress_bar: bool = True

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
        """Trainer steps between two weight syncs: one producer round of every inferencer."""
        produced = self.parallel.num_inferencers * self.batch.inference_batch_size
        return produced // (self.parallel.dp_size * self.batch.train_batch_size)


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def parse_eval_datasets(text: str | None) -> dict[str, str]:
    """``'{"name": "path.jsonl", ...}'`` -> mapping; names must be usable as file names."""
    if not text:
        return {}
    try:
        mapping = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"--eval-dataset is not valid JSON ({err.msg}); pass e.g. '{{\"math\": \"eval.jsonl\"}}'") from None
    _require(isinstance(mapping, dict) and mapping, "--eval-dataset must be a JSON object of task name -> jsonl path")
    for name, path in mapping.items():
        _require(bool(re.fullmatch(r"[A-Za-z0-9._-]+", name)) and name not in (".", ".."),
                 f"--eval-dataset task name {name!r} is not a valid file name (use letters, digits, . _ -)")
        _require(isinstance(path, str), f"--eval-dataset path for {name!r} must be a string")
    return mapping


def validate(config: RLConfig) -> None:
    """Cheap checks of the settings themselves (no file is opened here)."""
    p, b, s, d = config.parallel, config.batch, config.sampling, config.data
    _require(d.reward_type in REWARD_TYPES, f"unknown reward type {d.reward_type!r}; choose one of {', '.join(REWARD_TYPES)}")
    _require(config.algo.name in ALGOS, f"unknown algorithm {config.algo.name!r}; choose one of {', '.join(ALGOS)}")
    _require(p.backend in BACKENDS, f"unknown backend {p.backend!r}; choose one of {', '.join(BACKENDS)}")
    for flag, value in (("-i/--num-inferencer", p.num_inferencers), ("-t/--num-trainers", p.num_trainers),
                        ("-g/--num-generations", b.num_generations), ("-ibs", b.inference_batch_size),
                        ("-imbs", b.inference_microbatch_size), ("-tbs", b.train_batch_size),
                        ("-tMbs", b.train_minibatch_size), ("-tmbs", b.train_microbatch_size),
                        ("-e/--num-episodes", config.run.num_episodes), ("-mnt/--max-new-tokens", s.max_new_tokens),
                        ("-mpt/--max-prompt-tokens", d.max_prompt_tokens)):
        _require(value >= 1, f"{flag} must be at least 1, got {value}")
    _require(b.num_generations >= 2, "-g/--num-generations must be at least 2: advantages compare samples within a group")
    _require(p.num_inferencers % p.num_trainers == 0,
             f"num_inferencer ({p.num_inferencers}) must be a multiple of num_trainers ({p.num_trainers}): change -i or -t")
    model_parallel = p.tensor_parallel_size * p.pipeline_parallel_size
    _require(p.num_trainers % model_parallel == 0,
             f"num_trainers ({p.num_trainers}) must be a multiple of tp*pp ({model_parallel}): change -t, -tp or -pp")
    produced, consumed = p.num_inferencers * b.inference_batch_size, p.dp_size * b.train_batch_size
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
    _require(config.algo.loss.kl_coeff >= 0, "-kl/--kl-coeff must be >= 0")
    _require(config.algo.loss.loss_variation in LOSS_VARIATIONS, f"loss variation must be one of {LOSS_VARIATIONS}")
    _require(config.run.save_interval >= 0, "-si/--save-interval must be >= 0 (0 saves only at the end)")
    _not_yet(config)


def _not_yet(config: RLConfig) -> None:
    """Flags whose feature lands in a later issue accept only their default until then."""
    p, r = config.parallel, config.run
    pending = [
        (p.backend != "transformers", "-b vllm"),
        (p.num_trainers > 1, "-t > 1 (multi-rank trainer groups)"),
        (p.tensor_parallel_size > 1, "-tp > 1"),
        (p.pipeline_parallel_size > 1, "-pp > 1"),
        (p.zero_stage > 0, "-zero > 0"),
        (p.producer_tensor_parallel_size > 1, "-ptp > 1"),
        (config.algo.name != "GRPO", f"-a {config.algo.name}"),
        (r.eval_interval > 0, "-ei > 0 (evaluation during training; before/after always runs)"),
        (r.rollout_save_dir is not None, "-rsd/--rollout-save-dir"),
    ]
    for active, what in pending:
        _require(not active, f"{what} is not yet supported in this version; leave it at its default")


def check_inputs(config: RLConfig) -> None:
    """Checks that open files: the model directory and every dataset (parsed in full, line by line)."""
    from coati.dataset.jsonl import DatasetError, load_jsonl

    path = config.model.path
    _require(os.path.isdir(path), f"model directory not found: {path} (pass -m/--model a local HF model directory)")
    _require(os.path.isfile(os.path.join(path, "config.json")),
             f"{path} has no config.json: pass -m/--model a directory written by save_pretrained")
    if config.data.reward_type == "code":
        from rewards.code import SandboxUnavailable, check_sandbox_available

        try:
            check_sandbox_available()
        except SandboxUnavailable as err:
            raise ConfigError(str(err)) from None
    try:
        train = load_jsonl(config.data.train_path, config.data.reward_type)
        for name, eval_path in config.data.eval_paths.items():
            load_jsonl(eval_path, config.data.reward_type)
    except DatasetError as err:
        raise ConfigError(str(err)) from None
    per_producer = len(train) // config.parallel.num_inferencers
    _require(per_producer >= config.batch.inference_batch_size,
             f"{config.data.train_path} has {len(train)} prompts: each of the {config.parallel.num_inferencers} "
             f"inferencers needs at least -ibs={config.batch.inference_batch_size}; lower -ibs or add data")
