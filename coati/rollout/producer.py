"""The inferencer actor: samples G completions per prompt, scores them, and feeds the rollout buffer."""

from __future__ import annotations

import dataclasses
import os
import random
import warnings

import ray
import torch

from coati.cluster.weight_sync import make_receiver
from coati.config.tree import RLConfig
from coati.config.sampling import SamplingParams
from coati.dataset.loader import load_examples
from coati.rollout.evaluation import evaluate, evaluate_episodes
from coati.rollout.env import load_env, make_env
from coati.rollout.episode import episode_budget, episode_groups, episode_system_prompt
from coati.rollout.generation import prompt_shard, rollout_groups, tokenise_prompts
from coati.rollout.group import RolloutGroup
from coati.rollout.inference_backend import TransformersBackend
from coati.rollout.reward_model import reward_model_scorer
from coati.utils.actor_process import start_actor_process
from rewards.scorer import RewardScorer


def make_backend(config: RLConfig, rank: int = 0, role: str = "producer"):
    """The inference engine of a producer (or of the evaluator, ``role="evaluator"``) on the device and in the
    dtype the device rule gives this actor."""
    placement = config.parallel.model_placement(role)
    if config.parallel.backend == "transformers":
        return TransformersBackend.from_pretrained(config.model.path, config.batch.inference_microbatch_size,
                                                   placement)
    if config.parallel.backend == "vllm":
        from coati.rollout.vllm_backend import VLLMBackend, VLLMEngineOptions

        p = config.parallel
        longest = max([config.sampling.max_new_tokens, *(s.max_new_tokens for _, s in config.eval_sampling)])
        return VLLMBackend(config.model.path, VLLMEngineOptions(
            tensor_parallel_size=p.producer_tensor_parallel_size, kv_cache_gb=p.vllm_kv_cache_gb,
            gpu_memory_utilization=p.vllm_gpu_memory_utilization, seed=config.run.seed + 1000 + rank,
            max_model_len=config.data.max_prompt_tokens + longest, dtype=placement.vllm_dtype))
    raise ValueError(f"backend {config.parallel.backend!r} is not available")


class Producer:
    """Runs as a Ray actor (a plain, single-threaded one: math-verify needs the main thread)."""

    def __init__(self, config: RLConfig, rank: int, buffer, weight_store, num_threads: int | None = None):
        start_actor_process()
        # buffer and weight store may come as actor names: a restartable actor's constructor arguments must hold
        # no references (Ray warns on every run that a restart could fail once they are gone).
        buffer, weight_store = (ray.get_actor(h) if isinstance(h, str) else h for h in (buffer, weight_store))
        self.config, self.rank, self.buffer, self.weight_store = config, rank, buffer, weight_store
        torch.set_num_threads(num_threads or os.cpu_count() or 1)
        torch.manual_seed(config.run.seed + 1000 + rank)
        # collective: joins the group and receives in the background from here on (also while the model loads)
        self.weights = make_receiver(config, weight_store, rank)
        self.backend = make_backend(config, rank)
        self.tokenizer = self.backend.tokenizer
        self.scorer = RewardScorer(**config.data.scorer_options())
        # -a PPO: the reward model scores here, beside the engine: a forward pass per response costs less than
        # generating it, and the scores travel with the groups (no extra actor, no second transfer of samples).
        self.reward_model = reward_model_scorer(config.algo.ppo.reward_model, self.tokenizer,
                                                config.batch.inference_microbatch_size,
                                                config.parallel.model_placement("reward_model"))
        self.version = 0
        self.env_class = load_env(config.episodes.env) if config.episodes.env else None
        examples = load_examples(config.data.train_path, config.data.rows)
        start, end = prompt_shard(len(examples), config.parallel.num_inferencers, config.batch.inference_batch_size,
                                  config.algo.learner_chunk_size, rank)
        self.examples, self.skipped_long = self._tokenise(examples[start:end])
        self.rounds_per_episode = len(self.examples) // config.batch.inference_batch_size

    def _tokenise(self, examples):
        return tokenise_prompts(self.tokenizer, examples, episode_system_prompt(self.env_class, self.config),
                                self.config.data.max_prompt_tokens)

    def info(self) -> dict:
        return {"prompts": len(self.examples), "skipped_too_long": self.skipped_long,
                "rounds_per_episode": self.rounds_per_episode}

    def _sync_weights(self, min_version: int, timeout_s: float = 600.0) -> None:
        """Wait for a version >= ``min_version`` and load the newest one (newer than ours)."""
        self.version = self.weights.load_newest(self.backend.load_weights, self.version, min_version, timeout_s)

    def _episode_order(self, episode: int) -> list[int]:
        """Prompt order of ``episode``: each episode reshuffles the previous one's order."""
        order = list(range(len(self.examples)))
        for past in range(episode + 1):
            random.Random(self.config.run.seed * 7919 + past * 31 + self.rank).shuffle(order)
        return order

    def _refresh_weights(self) -> None:
        """Load the newest published weights if they are newer than ours; never waits (async mode)."""
        self.version = self.weights.load_newest(self.backend.load_weights, self.version)

    def run(self, num_rounds: int, start_round: int = 0) -> int:
        """Generate rounds ``start_round`` .. ``num_rounds - 1`` and put each, whole, into the buffer.

        Round r starts once the schedule admits it (weights version >= r - S; sync mode: exactly r). Each
        round samples with a seed of its own (seed, rank, round), so a resumed sync run samples what the
        uninterrupted run did there. In async mode a round is generated ``-imbs`` prompts per call, and newer
        weights published meanwhile are loaded between calls: a round may mix versions, each group records
        its own.

        A producer Ray restarted after its process died (supervision.py) runs this again: it continues at its
        first round the buffer has not received, which it regenerates (in sync mode, exactly as before).
        """
        from coati.cluster.schedule import round_seed

        start_round = max(start_round, ray.get(self.buffer.next_round.remote(self.rank)))
        with warnings.catch_warnings():  # the property reads a deprecated one inside Ray
            warnings.simplefilter("ignore")
            restarted = ray.get_runtime_context().was_current_actor_reconstructed
        if restarted:
            print(f"inferencer {self.rank} restarted on {ray.util.get_node_ip_address()} (pid {os.getpid()}): "
                  f"generating round {start_round} again", flush=True)
        ibs, imbs = self.config.batch.inference_batch_size, self.config.batch.inference_microbatch_size
        schedule = self.config.schedule
        order = None
        for round_index in range(start_round, num_rounds):
            episode, position = divmod(round_index, self.rounds_per_episode)
            if position == 0 or order is None:
                order = self._episode_order(episode)
            self._sync_weights(schedule.min_version(round_index))
            batch = [self.examples[i] for i in order[position * ibs : (position + 1) * ibs]]
            seed = round_seed(self.config.run.seed, self.rank, round_index)
            if not schedule.is_async:  # one call: the backend splits it into -imbs micro-batches itself
                groups = self._rollout(batch, dataclasses.replace(self.config.sampling, seed=seed))
            else:
                groups = []
                for chunk, start in enumerate(range(0, len(batch), imbs)):
                    if chunk:
                        self._refresh_weights()
                    params = dataclasses.replace(self.config.sampling, seed=round_seed(seed, self.rank, chunk))
                    groups += self._rollout(batch[start : start + imbs], params)
            ray.get(self.buffer.put.remote(groups, self.rank, round_index))
        return max(0, num_rounds - start_round)

    def _rollout(self, batch, params=None) -> list[RolloutGroup]:
        if self.env_class is not None:
            return episode_groups(self.backend, lambda: make_env(self.env_class), batch,
                                  params or self.config.sampling, episode_budget(self.config), self.version)
        return rollout_groups(self.backend, self.scorer, batch, params or self.config.sampling, self.version,
                              reward_model=self.reward_model)

    def evaluate(self, path: str, params: SamplingParams, latest_weights: bool = True) -> dict:
        """Accuracy on a held-out jsonl with the newest published weights; records for the eval logs."""
        if latest_weights:
            self._sync_weights(0)
        examples, skipped = self._tokenise(load_examples(path, self.config.data.rows))
        if self.env_class is not None:
            result = evaluate_episodes(self.backend, self.env_class, examples, params, episode_budget(self.config))
        else:
            result = evaluate(self.backend, [ids for _, _, ids in examples], [e for e, _, _ in examples],
                              self.scorer, params, prompt_texts=[text for _, text, _ in examples],
                              reward_model=self.reward_model)
        return {**result.summary(), "count": len(examples), "skipped_too_long": skipped, "version": self.version,
                "records": result.records}
