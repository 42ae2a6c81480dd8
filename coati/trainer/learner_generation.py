"""Learner-side generation (``--learner-chunk-size N``): the trainer generates N prompts of every round itself.

In sync mode the trainers idle while the producers generate a round. With N > 0 the trainer actor that
sends weights (``plugin.is_weight_sender``) owns a ``LearnerGenerator``: its own inference model (loaded
from ``config.model.path``, then refreshed in place from the full tensors the trainer gathers for each
publish, no disk), its own prompt shard and episode shuffle. At the start of round ``v`` (right after
weights version ``v`` are published, and once before the first draw at version 0) it samples G completions
for N prompts with exactly those weights, scores them with the training reward, and puts the groups into
the shared rollout buffer tagged with version ``v``. Every trainer rank then draws them through the normal
shared reads, so all ranks agree on the data, DAPO's filter and dynamic batching work unchanged, and the
groups are on-policy like the producers'. A round therefore holds ``num_inferencers * ibs + N`` groups
(``RLConfig.groups_per_sync``).

It always uses the transformers backend on the CPU, in the trainer's process: it shares the trainer's
threads, which are otherwise idle while the producers generate.
"""

from __future__ import annotations

import random
import time

import ray
import torch

from coati.cluster.schedule import LEARNER
from coati.config.tree import RLConfig
from coati.dataset.loader import load_examples
from coati.rollout.generation import prompt_shard, rollout_groups, tokenise_prompts
from coati.rollout.group import RolloutGroup
from coati.rollout.inference_backend import TransformersBackend
from rewards.scorer import RewardScorer


class LearnerGenerator:
    def __init__(self, config: RLConfig, backend: TransformersBackend | None = None):
        self.config = config
        self.chunk = config.algo.learner_chunk_size
        if self.chunk < 1:
            raise ValueError("LearnerGenerator needs learner_chunk_size >= 1")
        self.backend = backend or TransformersBackend.from_pretrained(
            config.model.path, config.batch.inference_microbatch_size,
            config.parallel.model_placement("learner_generation"), config.engine_adapters)
        self.scorer = RewardScorer(**config.data.scorer_options())
        # The learner's shard comes after every producer's; its shuffle stream index likewise.
        self.stream = config.parallel.num_inferencers
        examples = load_examples(config.data.train_path, config.data.rows)
        start, end = prompt_shard(len(examples), config.parallel.num_inferencers, config.batch.inference_batch_size,
                                  self.chunk, self.stream)
        self.examples, self.skipped_long = tokenise_prompts(self.backend.tokenizer, examples[start:end],
                                                            config.data.system_prompt, config.data.max_prompt_tokens)
        self.rounds_per_episode = len(self.examples) // self.chunk
        self._order: list[int] = []
        self._order_episode = -1
        self.rounds_generated = 0
        self.last_round = -1  # the newest round generated
        self.time_s = 0.0  # seconds spent generating and scoring since the last ``take_time``

    def info(self) -> dict:
        return {"prompts": len(self.examples), "skipped_too_long": self.skipped_long,
                "rounds_per_episode": self.rounds_per_episode}

    def load_weights(self, named_tensors) -> None:
        """Copy the just-published tensors (full weights, or adapters) into the inference model in place."""
        self.backend.load_weights(named_tensors)

    def batch(self, round_index: int) -> list:
        """The N (example, text, ids) prompts of ``round_index``: the producers' episode/shuffle scheme."""
        if self.rounds_per_episode == 0:
            raise RuntimeError(f"the learner's prompt shard holds {len(self.examples)} usable prompts, "
                               f"fewer than --learner-chunk-size {self.chunk}")
        episode, position = divmod(round_index, self.rounds_per_episode)
        if episode != self._order_episode:
            self._order = list(range(len(self.examples)))
            random.Random(self.config.run.seed * 7919 + episode * 31 + self.stream).shuffle(self._order)
            self._order_episode = episode
        return [self.examples[i] for i in self._order[position * self.chunk : (position + 1) * self.chunk]]

    def generate(self, round_index: int, version: int) -> list[RolloutGroup]:
        """The round's groups, sampled with the weights loaded now (tagged ``version``).

        Sampling draws from its own seeded stream per round (the trainer's RNG state is left untouched), so a
        round's groups do not depend on what the trainer did before.
        """
        start = time.perf_counter()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.config.run.seed * 7919 + 2003 + round_index)
            groups = rollout_groups(self.backend, self.scorer, self.batch(round_index), self.config.sampling,
                                    version, learner=True)
        self.rounds_generated += 1
        self.last_round = round_index
        self.time_s += time.perf_counter() - start
        return groups

    def fill(self, buffer, round_index: int, version: int) -> None:
        """Generate the round's groups (once per round) and put them into the shared buffer."""
        if round_index <= self.last_round:
            return
        ray.get(buffer.put.remote(self.generate(round_index, version), LEARNER, round_index))

    def take_time(self) -> float:
        spent, self.time_s = self.time_s, 0.0
        return spent
