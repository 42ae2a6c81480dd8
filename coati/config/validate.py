"""Start-up checks of a run's settings alone (no file is opened here: coati/launcher/preflight.py does that).

Every check raises ``ConfigError`` with one line that names the problem and the fix, before any actor, model or
Ray cluster is started. The algorithm's own checks are validate_algo.py.
"""

from __future__ import annotations

from coati.cluster.weight_sync import WEIGHT_SYNC
from coati.config.algo import ALGOS
from coati.config.data import DataConfig
from coati.config.errors import ConfigError, require
from coati.config.layout import BACKENDS, PLUGIN_FAMILIES, ParallelConfig
from coati.config.run import RunConfig
from coati.config.tree import RLConfig
from coati.config.validate_algo import validate_algo
from rewards import REWARD_TYPES


def validate(config: RLConfig) -> None:
    """Cheap checks of the settings themselves (no file is opened here)."""
    p, b, s, d = config.parallel, config.batch, config.sampling, config.data
    require(d.reward_type in REWARD_TYPES, f"unknown reward type {d.reward_type!r}; choose one of {', '.join(REWARD_TYPES)}")
    _validate_keys(d)
    _validate_user_rewards(d)
    if d.reward_type == "code":
        require(d.code.workers is None or d.code.workers >= 1, "--code-workers must be at least 1")
        try:
            d.code.scorer_options()
        except ValueError as err:
            raise ConfigError(f"code sandbox limits: {err} (see --code-cpu-seconds, --code-wall-seconds, "
                              "--code-memory-mb, --code-max-processes)") from None
    require(config.algo.name in ALGOS, f"unknown algorithm {config.algo.name!r}; choose one of {', '.join(ALGOS)}")
    require(p.backend in BACKENDS, f"unknown backend {p.backend!r}; choose one of {', '.join(BACKENDS)}")
    for flag, value in (("-i/--num-inferencer", p.num_inferencers), ("-t/--num-trainers", p.num_trainers),
                        ("-g/--num-generations", b.num_generations), ("-ibs", b.inference_batch_size),
                        ("-imbs", b.inference_microbatch_size), ("-tbs", b.train_batch_size),
                        ("-tMbs", b.train_minibatch_size), ("-tmbs", b.train_microbatch_size),
                        ("-e/--num-episodes", config.run.num_episodes), ("-mnt/--max-new-tokens", s.max_new_tokens),
                        ("-mpt/--max-prompt-tokens", d.max_prompt_tokens)):
        require(value >= 1, f"{flag} must be at least 1, got {value}")
    require(b.num_generations >= 2 or config.algo.uses_critic,
            "-g/--num-generations must be at least 2: group advantages compare samples within a group "
            "(-a PPO's critic allows -g 1)")
    require(p.plugin in PLUGIN_FAMILIES, f"unknown --plugin {p.plugin!r}; choose one of {', '.join(PLUGIN_FAMILIES)}")
    _validate_layout(config)
    _validate_batches(config)
    require(s.temperature > 0, "-temp/--temperature must be > 0 for training: greedy groups are identical and learn nothing")
    require(0 < s.top_p <= 1, f"-topp/--top-p must lie in (0, 1], got {s.top_p}")
    require(s.top_k == -1 or s.top_k >= 1, f"-topk/--top-k must be -1 (off) or >= 1, got {s.top_k}")
    require(config.algo.learning_rate > 0, "-lr/--learning-rate must be > 0")
    require(p.producer_tensor_parallel_size >= 1, f"-ptp must be at least 1, got {p.producer_tensor_parallel_size}")
    require(p.producer_tensor_parallel_size == 1 or p.backend == "vllm",
            "-ptp > 1 (inference tensor parallelism) needs -b vllm")
    _validate_weight_sync(p)
    require(p.vllm_kv_cache_gb > 0, f"--vllm-kv-cache-gb must be > 0, got {p.vllm_kv_cache_gb}")
    require(0 < p.vllm_gpu_memory_utilization <= 1,
            f"--vllm-gpu-memory-utilization must lie in (0, 1], got {p.vllm_gpu_memory_utilization}")
    validate_algo(config)
    require(config.run.save_interval >= 0, "-si/--save-interval must be >= 0 (0 saves only at the end)")
    _validate_logs(config)
    _validate_cluster(config.run)


def _validate_batches(config: RLConfig) -> None:
    """-i/-ibs/-imbs against -t/-tbs/-tMbs/-tmbs: rounds tile into steps, steps into micro-batches."""
    p, b = config.parallel, config.batch
    produced, consumed = p.num_inferencers * b.inference_batch_size, p.dp_size * b.train_batch_size
    if config.algo.learner_chunk_size > 0:  # a round also holds the learner's groups; steps must tile it
        chunk = config.algo.learner_chunk_size
        require((produced + chunk) % consumed == 0,
                 f"num_inferencer*ibs + --learner-chunk-size ({produced} + {chunk} = {produced + chunk}) must be a "
                 f"multiple of data-parallel trainers*tbs ({consumed}): change --learner-chunk-size, -ibs or -tbs")
    else:
        require(produced % consumed == 0,
                 f"num_inferencer*ibs ({produced}) must be a multiple of data-parallel trainers*tbs ({consumed}): "
                 "change -i, -ibs, -t or -tbs")
    require(b.train_batch_size >= b.train_minibatch_size,
            f"-tbs ({b.train_batch_size}) must be >= -tMbs ({b.train_minibatch_size})")
    require(b.train_batch_size % b.train_minibatch_size == 0,
            f"-tbs ({b.train_batch_size}) must be a multiple of -tMbs ({b.train_minibatch_size})")
    require(b.train_minibatch_size * b.num_generations >= b.train_microbatch_size,
            f"-tMbs*g ({b.train_minibatch_size * b.num_generations} samples) must be >= -tmbs ({b.train_microbatch_size})")
    require(b.inference_batch_size >= b.inference_microbatch_size,
            f"-ibs ({b.inference_batch_size}) must be >= -imbs ({b.inference_microbatch_size})")


def _validate_cluster(r: RunConfig) -> None:
    """--master_address (the Ray head to join) and --master_port (the trainers' rendezvous)."""
    from coati.cluster.connect import parse_address

    if r.master_address is not None:
        try:
            parse_address(r.master_address)
        except ValueError as err:
            raise ConfigError(str(err)) from None
    require(r.master_port is None or 1 <= r.master_port <= 65535,
            f"--master_port must lie in 1..65535 (the trainers' rendezvous port), got {r.master_port}")


def _validate_weight_sync(p: ParallelConfig) -> None:
    require(p.weight_sync in WEIGHT_SYNC,
            f"--weight-sync must be one of {', '.join(WEIGHT_SYNC)}, got {p.weight_sync!r}")
    require(p.weight_sync_bucket_mb > 0, f"--weight-sync-bucket-mb must be > 0, got {p.weight_sync_bucket_mb:g}")
    require(p.weight_sync_timeout_s > 0, f"--weight-sync-timeout must be > 0 seconds, got {p.weight_sync_timeout_s:g}")


def _validate_user_rewards(d: DataConfig) -> None:
    """--reward-weights, --reward-url and its limits (the functions themselves: preflight.check_user_rewards)."""
    from rewards.combine import RewardWeightsError, parse_weights, resolve_weights
    from rewards.remote import check_reward_url

    names = [d.reward_type, *(spec.rpartition(":")[2] for spec in d.reward_fn), *(["remote"] if d.reward_url else [])]
    try:
        resolve_weights(names, parse_weights(d.reward_weights))
    except RewardWeightsError as err:
        raise ConfigError(str(err)) from None
    if d.reward_url is not None:
        problem = check_reward_url(d.reward_url)
        require(problem is None, problem or "")
    require(d.reward_url_timeout > 0, f"--reward-url-timeout must be > 0 seconds, got {d.reward_url_timeout:g}")
    require(d.reward_url_retries >= 0, f"--reward-url-retries must be >= 0, got {d.reward_url_retries}")


def _validate_keys(d: DataConfig) -> None:
    """--input-key/--label-key: non-empty and different (whether rows have them: check_inputs)."""
    for flag, key in (("--input-key", d.input_key), ("--label-key", d.label_key)):
        require(key is None or (isinstance(key, str) and key.strip() == key and key != ""),
                 f"{flag} must be a field name without surrounding spaces, e.g. {flag} question; got {key!r}")
    require(d.input_key != d.rows.label_field,
            f"--input-key and --label-key both name {d.input_key!r}: the prompt and the answer need their own fields")


def _validate_logs(config: RLConfig) -> None:
    """-ei, -rsd and their intervals (the eval files themselves are checked in check_inputs)."""
    r = config.run
    require(r.eval_interval >= 0, f"-ei/--eval-interval must be >= 0 (0: evaluate before and after training only), "
                                   f"got {r.eval_interval}")
    require(r.eval_interval == 0 or config.data.eval_paths,
            "-ei/--eval-interval needs held-out data: pass -ed/--eval-dataset '{\"name\": \"eval.jsonl\"}'")
    require(r.rollout_save_interval >= 1, f"--rollout-save-interval must be at least 1, got {r.rollout_save_interval}")


def _validate_layout(config: RLConfig) -> None:
    """-t/-tp/-pp/-zero/--precision against the plugin family (the model's heads and layers: check_inputs)."""
    from coati.plugins.validation import ParallelLayout, validate_layout

    p, b = config.parallel, config.batch
    for flag, value in (("-tp/--tensor-parallel-size", p.tensor_parallel_size),
                        ("-pp/--pipeline-parallel-size", p.pipeline_parallel_size)):
        require(value >= 1, f"{flag} must be at least 1, got {value}")
    model_parallel = p.tensor_parallel_size * p.pipeline_parallel_size
    require(p.num_trainers % model_parallel == 0,
            f"num_trainers ({p.num_trainers}) must be a multiple of tp*pp ({model_parallel}): change -t, -tp or -pp")
    require(p.zero_stage in (0, 1, 2, 3), f"-zero/--zero-stage must be 0, 1, 2 or 3, got {p.zero_stage}")
    require(not (p.plugin == "torch" and p.tensor_parallel_size > 1 and p.pipeline_parallel_size > 1),
            "-tp and -pp together need --plugin colossalai (HybridParallelPlugin); the torch family does one of them")
    require(not (p.plugin == "torch" and p.zero_stage > 0 and p.pipeline_parallel_size > 1),
            "-zero with -pp needs --plugin colossalai; the torch pipeline plugin is data parallel by DDP only")
    if p.pipeline_parallel_size > 1:
        require(b.train_microbatch_size >= p.pipeline_parallel_size,
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
