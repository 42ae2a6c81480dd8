"""Start-up checks of a run's settings alone (no file is opened here: coati/launcher/preflight.py does that).

Every check raises ``ConfigError`` with one line that names the problem and the fix, before any actor, model or
Ray cluster is started. The algorithm's own checks are validate_algo.py.
"""

from __future__ import annotations

import math

from coati.config.algo import ALGOS
from coati.config.data import DataConfig
from coati.config.lora_sync import family_refusal, lora_sync_choice
from coati.config.errors import ConfigError, require
from coati.config.health import parse_health
from coati.config.layout import ParallelConfig
from coati.config.run import RunConfig, check_wait_scale
from coati.config.tree import RLConfig
from coati.dataset.jsonl import SYSTEM_SLOT, prompt_template_problem
from coati.config.validate_algo import validate_algo
from coati.registry.backends import BACKENDS
from coati.registry.weight_sync import DEFAULT_WEIGHT_SYNC, WEIGHT_SYNCS
from rewards import REWARD_TYPES


def check_prompt_options(d, system_prompt: str | None) -> None:
    """--prompt-template and --stop of any command that generates from rows (``d``: a PromptOptions), with
    ``system_prompt`` the -s it will use."""
    require(all(d.stop), "--stop needs a text to stop at, got an empty string")
    if d.prompt_template is None:
        return
    problem = prompt_template_problem(d.prompt_template)
    require(problem is None, problem or "")
    require(not system_prompt or SYSTEM_SLOT in d.prompt_template,
            f"-s/--system-prompt is given but --prompt-template {d.prompt_template!r} has no {SYSTEM_SLOT}: put "
            f"{SYSTEM_SLOT} where it goes, or leave -s out")


def validate(config: RLConfig) -> None:
    """Cheap checks of the settings themselves (no file is opened here)."""
    p, b, s, d = config.parallel, config.batch, config.sampling, config.data
    require(d.reward_type in REWARD_TYPES, f"unknown reward type {d.reward_type!r}; choose one of {', '.join(REWARD_TYPES)}")
    _validate_keys(d)
    check_reward_options(d, d.reward_type)
    check_prompt_options(d, d.system_prompt)
    if REWARD_TYPES[d.reward_type].needs_sandbox:
        require(d.code.workers is None or d.code.workers >= 1, "--code-workers must be at least 1")
        try:
            d.code.scorer_options()
        except ValueError as err:
            raise ConfigError(f"code sandbox limits: {err} (see --code-cpu-seconds, --code-wall-seconds, "
                              "--code-memory-mb, --code-max-processes)") from None
    require(config.algo.name in ALGOS, f"unknown algorithm {config.algo.name!r}; choose one of {', '.join(ALGOS)}")
    require(p.backend in BACKENDS, f"unknown backend {p.backend!r}; choose one of {', '.join(BACKENDS)}")
    if not p.colocate:
        require(p.num_inferencers >= 1, f"-i/--num-inferencer must be at least 1, got {p.num_inferencers} (or train "
                                         "and generate on the trainer ranks' devices: --colocate)")
    for flag, value in (("-g/--num-generations", b.num_generations), ("-ibs", b.inference_batch_size),
                        ("-imbs", b.inference_microbatch_size), ("-tbs", b.train_batch_size),
                        ("-tMbs", b.train_minibatch_size), ("-tmbs", b.train_microbatch_size),
                        ("-e/--num-episodes", config.run.num_episodes), ("-mnt/--max-new-tokens", s.max_new_tokens),
                        ("-mpt/--max-prompt-tokens", d.max_prompt_tokens)):
        require(value >= 1, f"{flag} must be at least 1, got {value}")
    require(b.train_microbatch_tokens >= 0, f"-tmbt/--train-microbatch-tokens must be at least 0 (0: -tmbs x (-mpt + "
            f"-mnt)), got {b.train_microbatch_tokens}")
    require(b.packing != "on" or config.parallel.plugin_spec.packs_rows,
            f"--packing on: the {config.parallel.plugin_name} plugin cannot pack samples (pipeline stages and "
            "ColossalAI's hybrid plugin run forwards of their own); use --packing auto or off")
    require(b.shared_prompts != "on" or (config.parallel.plugin_spec.shares_prompts
                                         and not config.algo.optim.gradient_checkpointing),
            f"--shared-prompts on: the {config.parallel.plugin_name} plugin"
            + (" with --gradient-checkpointing" if config.parallel.plugin_spec.shares_prompts else "")
            + " cannot run a group's prompt once (it needs the single-process plugin, whose two forwards keep a KV "
              "cache); use --shared-prompts auto or off")
    require(b.num_generations >= 2 or config.algo.uses_critic,
            "-g/--num-generations must be at least 2: group advantages compare samples within a group "
            "(-a PPO's critic allows -g 1)")
    p.check()
    _validate_pipeline_batches(config)
    _validate_batches(config)
    require(s.temperature > 0, "-temp/--temperature must be > 0 for training: greedy groups are identical and learn nothing")
    require(0 < s.top_p <= 1, f"-topp/--top-p must lie in (0, 1], got {s.top_p}")
    require(s.top_k == -1 or s.top_k >= 1, f"-topk/--top-k must be -1 (off) or >= 1, got {s.top_k}")
    require(config.algo.learning_rate > 0, "-lr/--learning-rate must be > 0")
    require(p.producer_tensor_parallel_size >= 1, f"-ptp must be at least 1, got {p.producer_tensor_parallel_size}")
    require(p.producer_tensor_parallel_size == 1 or BACKENDS[p.backend].tensor_parallel,
            "-ptp > 1 (inference tensor parallelism) needs -b "
            + " or -b ".join(name for name, spec in BACKENDS.items() if spec.tensor_parallel))
    _validate_weight_sync(p)
    _validate_colocation(config)
    p.check_lora(config.model.lora)
    if config.model.lora.enabled:  # --lora-sync adapters with an engine that cannot take them: one line now
        lora_sync_choice(config.model.lora_sync, p.backend_spec, config.model.lora.lora_rank, False,
                         family_refusal(config))
    require(p.vllm_kv_cache_gb > 0, f"--vllm-kv-cache-gb must be > 0, got {p.vllm_kv_cache_gb}")
    require(0 < p.vllm_gpu_memory_utilization <= 1,
            f"--vllm-gpu-memory-utilization must lie in (0, 1], got {p.vllm_gpu_memory_utilization}")
    validate_algo(config)
    require(config.run.save_interval >= 0, "-si/--save-interval must be >= 0 (0 saves only at the end)")
    require(config.run.keep_checkpoints >= 0,
            f"--keep-checkpoints must be >= 0 (0 keeps all), got {config.run.keep_checkpoints}")
    _validate_logs(config)
    _validate_cluster(config.run)
    _validate_episodes(config)


def _validate_episodes(config: RLConfig) -> None:
    """--env's budgets (every generator runs episodes: producers, colocated ranks, the learner)."""
    problem = config.episodes.problem()
    require(problem is None, problem or "")
    require(config.episodes.env is None or config.algo.ppo.reward_model is None,
            "--env episodes are rewarded by the environment: drop --reward-model (or --env)")


def _validate_colocation(config: RLConfig) -> None:
    """--colocate: the trainer ranks are the only generators, one after the other with training."""
    p = config.parallel
    require(p.colocate or not p.offload_optimizer, "--offload-optimizer needs --colocate (it frees the trainer's "
                                                   "memory for the engine on the same GPU)")
    if not p.colocate:
        return
    require(p.num_inferencers == 0, f"--colocate: the trainer ranks generate and there are no inferencer actors: "
                                    f"drop -i {p.num_inferencers} (or drop --colocate)")
    require(p.max_staleness == 0, "--colocate trains and generates on the same devices one after the other, so "
                                  "-nb/--max-staleness has no overlap to gain: drop -nb, or use the decoupled layout "
                                  "(-i N without --colocate) for async rollouts")
    require(config.algo.learner_chunk_size == 0, "--colocate: every trainer rank already generates its share of "
                                                 "each round: drop --learner-chunk-size")
    require(p.weight_sync == DEFAULT_WEIGHT_SYNC, "--weight-sync: with --colocate weights never leave the trainer "
                                             "ranks' processes: drop --weight-sync")
    require(BACKENDS[p.backend].colocates, f"--colocate: -b {p.backend} cannot run inside a trainer rank; use -b "
            + " or -b ".join(name for name, spec in BACKENDS.items() if spec.colocates) + " (or drop --colocate)")
    require(p.producer_tensor_parallel_size == 1, "-ptp: with --colocate each trainer rank's engine runs on that "
                                                  "rank's own device: drop -ptp")


def _validate_batches(config: RLConfig) -> None:
    """-i/-ibs/-imbs against -t/-tbs/-tMbs/-tmbs: rounds tile into steps, steps into micro-batches."""
    p, b = config.parallel, config.batch
    produced, consumed = p.rollout_sources * b.inference_batch_size, p.dp_size * b.train_batch_size
    generators = "trainers*ibs (--colocate)" if p.colocate else "num_inferencer*ibs"
    if config.algo.learner_chunk_size > 0:  # a round also holds the learner's groups; steps must tile it
        chunk = config.algo.learner_chunk_size
        require((produced + chunk) % consumed == 0,
                 f"num_inferencer*ibs + --learner-chunk-size ({produced} + {chunk} = {produced + chunk}) must be a "
                 f"multiple of data-parallel trainers*tbs ({consumed}): change --learner-chunk-size, -ibs or -tbs")
    else:
        require(produced % consumed == 0,
                 f"{generators} ({produced}) must be a multiple of data-parallel trainers*tbs ({consumed}): "
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
    """--master_address (the Ray head to join), --master_port (the trainers' rendezvous) and --wait-scale."""
    from coati.cluster.connect import parse_address

    if r.master_address is not None:
        try:
            parse_address(r.master_address)
        except ValueError as err:
            raise ConfigError(str(err)) from None
    require(r.master_port is None or 1 <= r.master_port <= 65535,
            f"--master_port must lie in 1..65535 (the trainers' rendezvous port), got {r.master_port}")
    check_wait_scale(r.wait_scale)


def _validate_weight_sync(p: ParallelConfig) -> None:
    require(p.weight_sync in WEIGHT_SYNCS,
            f"--weight-sync must be one of {', '.join(WEIGHT_SYNCS)}, got {p.weight_sync!r}")
    require(p.weight_sync_bucket_mb > 0, f"--weight-sync-bucket-mb must be > 0, got {p.weight_sync_bucket_mb:g}")
    require(p.weight_sync_timeout_s > 0, f"--weight-sync-timeout must be > 0 seconds, got {p.weight_sync_timeout_s:g}")


def check_reward_options(d, reward_type: str) -> None:
    """--reward-weights, --reward-url and its limits of any command that scores (``d``: a RewardOptions) with
    ``reward_type`` the built-in one (the functions themselves: preflight.check_user_rewards)."""
    from rewards.combine import RewardWeightsError, parse_weights, resolve_weights
    from rewards.remote import check_reward_url

    try:
        resolve_weights([reward_type, *d.added_reward_names], parse_weights(d.reward_weights))
    except RewardWeightsError as err:
        raise ConfigError(str(err)) from None
    if d.reward_url is not None:
        problem = check_reward_url(d.reward_url)
        require(problem is None, problem or "")
    require(d.reward_url_timeout > 0, f"--reward-url-timeout must be > 0 seconds, got {d.reward_url_timeout:g}")
    require(d.reward_url_retries >= 0, f"--reward-url-retries must be >= 0, got {d.reward_url_retries}")
    require(d.correct_threshold is None or math.isfinite(d.correct_threshold),
            f"--correct-threshold must be a finite number, got {d.correct_threshold}")


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
    require(r.equal_reward_steps >= 0, f"--equal-reward-steps must be >= 0 (0: no warning), got {r.equal_reward_steps}")
    parse_health(r.health)  # a bad --health item is its one ConfigError line
    require(r.delivery_bound >= 0, f"--delivery-bound {r.delivery_bound:g}: a gap in nats is >= 0 (0: by precision)")
    require(r.rollout_save_interval >= 1, f"--rollout-save-interval must be at least 1, got {r.rollout_save_interval}")


def _validate_pipeline_batches(config: RLConfig) -> None:
    """-pp against -tmbs (the layout's own rules: TrainerLayout.check; the model's heads and layers: check_inputs)."""
    p, b = config.parallel, config.batch
    if p.pipeline_parallel_size > 1:
        require(b.train_microbatch_size >= p.pipeline_parallel_size,
                 f"-tmbs ({b.train_microbatch_size}) must be >= -pp ({p.pipeline_parallel_size}): pipeline "
                 "micro-batches hold tmbs // pp samples")
