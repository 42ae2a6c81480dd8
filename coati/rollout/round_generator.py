"""One generator's rounds without Ray: its prompt shard and episode order, sampling and scoring a round's groups
(with the run's environment and tools, or the PPO reward model), and held-out evaluation, on an inference engine
it is handed. It is the only way a round is made.

Three owners run it, each as one generator *stream* of the schedule (``RolloutSchedule.source``): a producer
actor (rollout/producer.py), which adds the weight receiving and the buffer; a colocated trainer rank
(``--colocate``, trainer/colocated.py), which generates its share of each round in its own process; and the
weight-sending trainer rank with ``--learner-chunk-size N`` (trainer/own_rounds.py), the stream after all the
others. A stream's round size is the schedule's count for it (``-ibs``, or N for the learner), its shard the
matching part of the data (``prompt_shard``), its episode order and sampling seeds come from (run seed, stream,
round). So a colocated run samples, shard for shard and seed for seed, what a decoupled run with as many
producers samples.

Learner-side generation had a generator of its own before: from its second episode on it shuffled once per
episode instead of reshuffling cumulatively, and it seeded the global RNG with ``seed * 7919 + 2003 + round``
instead of ``round_seed(seed, stream, round)``. Its prompt order in episode 0 is unchanged; its samples, and
its order from episode 1, now follow the producers' rules (one rule for every stream: a resumed learner
rebuilds its order as a producer does).
"""

from __future__ import annotations

import dataclasses
import random

from coati.config.sampling import SamplingParams
from coati.config.tree import RLConfig
from coati.dataset.loader import load_examples
from coati.rollout.env import load_env, make_env
from coati.rollout.episode import episode_budget, episode_groups, episode_system_prompt
from coati.rollout.evaluation import held_out_row
from coati.rollout.generation import prompt_shard, rollout_groups, tokenise_prompts
from coati.rollout.group import RolloutGroup
from coati.rollout.reward_model import reward_model_scorer
from rewards.scorer import RewardScorer


class RoundGenerator:
    def __init__(self, config: RLConfig, stream: int, backend):
        from coati.cluster.schedule import LEARNER

        self.config, self.stream, self.backend = config, stream, backend
        schedule = config.schedule
        self.source = schedule.source(stream)  # its slots in the buffer's rounds
        self.round_size = schedule.round_size(self.source)
        self.learner = self.source == LEARNER  # its groups say they were made by the trainer
        self.tokenizer = backend.tokenizer
        self.scorer = RewardScorer(**config.data.scorer_options())
        # -a PPO: the reward model scores beside the engine: a forward pass per response costs less than
        # generating it, and the scores travel with the groups (no extra actor, no second transfer of samples).
        self.reward_model = reward_model_scorer(config.algo.ppo.reward_model, self.tokenizer,
                                                config.batch.inference_microbatch_size,
                                                config.parallel.model_placement("reward_model"))
        self.env_class = load_env(config.episodes.env) if config.episodes.env else None
        examples = load_examples(config.data.train_path, config.data.rows)
        start, end = prompt_shard(len(examples), config.parallel.rollout_sources, config.batch.inference_batch_size,
                                  config.algo.learner_chunk_size, stream)
        self.examples, self.skipped_long = self.tokenise(examples[start:end])
        self.rounds_per_episode = len(self.examples) // self.round_size
        self._order: list[int] = []
        self._order_episode = -1

    def tokenise(self, examples):
        return run_prompts(self.tokenizer, examples, self.env_class, self.config)

    def info(self) -> dict:
        return {"prompts": len(self.examples), "skipped_too_long": self.skipped_long,
                "rounds_per_episode": self.rounds_per_episode}

    def episode_order(self, episode: int) -> list[int]:
        """Prompt order of ``episode``: each episode reshuffles the previous one's order."""
        order = list(range(len(self.examples)))
        for past in range(episode + 1):
            random.Random(self.config.run.seed * 7919 + past * 31 + self.stream).shuffle(order)
        return order

    def batch(self, round_index: int) -> list:
        """The ``round_size`` (example, text, ids) prompts of ``round_index``."""
        size = self.round_size
        if self.rounds_per_episode == 0:
            raise RuntimeError(f"generator {self.source}'s prompt shard holds {len(self.examples)} usable prompts, "
                               f"fewer than one round of {size}: add data or make the rounds smaller")
        episode, position = divmod(round_index, self.rounds_per_episode)
        if episode != self._order_episode:
            self._order, self._order_episode = self.episode_order(episode), episode
        return [self.examples[i] for i in self._order[position * size : (position + 1) * size]]

    def round_params(self, round_index: int, chunk: int | None = None) -> SamplingParams:
        """Sampling of ``round_index`` (of one ``-imbs`` chunk of it in async mode): its own seed from (seed, stream,
        round), so a resumed sync run samples what the uninterrupted run did there."""
        from coati.cluster.schedule import round_seed

        seed = round_seed(self.config.run.seed, self.stream, round_index)
        if chunk is not None:
            seed = round_seed(seed, self.stream, chunk)
        return dataclasses.replace(self.config.sampling, seed=seed)

    def rollout(self, batch, params: SamplingParams, version: int) -> list[RolloutGroup]:
        """G completions per prompt of ``batch``, scored, as groups tagged with weights ``version``."""
        if self.env_class is not None:
            return episode_groups(self.backend, lambda: make_env(self.env_class), batch, params,
                                  episode_budget(self.config), version, learner=self.learner)
        return rollout_groups(self.backend, self.scorer, batch, params, version, learner=self.learner,
                              reward_model=self.reward_model)

    def evaluate(self, path: str, params: SamplingParams, version: int) -> dict:
        """Accuracy on a held-out file with the engine's current weights; records for the eval logs."""
        examples, skipped = self.tokenise(load_examples(path, self.config.data.rows))
        return held_out_row(self.backend, examples, skipped, params, self.scorer, version, self.reward_model,
                            self.env_class, episode_budget(self.config))


def run_prompts(tokenizer, examples, env_class, config):
    """``examples`` as the run's prompts (its system prompt and the environment's tools, its template, -mpt), for
    training and evaluation alike: ``tokenise_prompts``' (kept, skipped)."""
    return tokenise_prompts(tokenizer, examples, episode_system_prompt(env_class, config),
                            config.data.max_prompt_tokens, config.data.prompt_template)
