"""The trainer actor base: pulls groups from the buffer, runs optimizer steps through a plugin, syncs weights.

One ``step()`` is one optimizer step: ``tbs / tMbs`` minibatches of ``tMbs`` groups are pulled, each split
into micro-batches of ``tmbs`` samples for forward/backward, gradients accumulate over the whole step.
Every ``steps_per_sync`` steps the weight sender publishes a new numbered version of the weights.
Algorithm specifics (the loss, extra tensors) live in subclasses.
"""

from __future__ import annotations

import os
import time

import ray
import torch

from coati.distributed.config import RLConfig
from coati.distributed.rollout import RolloutGroup, collate, split_micro_batches
from coati.distributed.weight_sync import pack_named_tensors
from coati.plugins import make_plugin


class Consumer:
    def __init__(self, config: RLConfig, rank: int, buffer, weight_store, num_threads: int | None = None):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.config, self.rank, self.buffer, self.weight_store = config, rank, buffer, weight_store
        torch.set_num_threads(num_threads or os.cpu_count() or 1)
        torch.manual_seed(config.run.seed + rank)
        self.tokenizer = AutoTokenizer.from_pretrained(config.model.path)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        self.plugin = make_plugin(config.parallel.plugin)
        model = AutoModelForCausalLM.from_pretrained(config.model.path, dtype=torch.float32)
        self.plugin.setup(model, config.algo.learning_rate)
        self.step_count = 0
        self.version = 0
        self._published = None  # keeps the newest weights alive in the object store
        self.setup_algorithm()

    def setup_algorithm(self) -> None:
        """Hook for subclasses (e.g. loading a reference model)."""

    def loss_fn(self, logits: torch.Tensor, micro_batch: dict) -> tuple[torch.Tensor, dict]:
        raise NotImplementedError

    def prepare(self, batch: dict[str, torch.Tensor], num_minibatches: int) -> dict[str, torch.Tensor]:
        """Hook: add tensors the loss needs for a collated minibatch (normalisers, reference logprobs)."""
        return batch

    def _pull(self, minibatch_index: int) -> list[RolloutGroup]:
        request = f"step{self.step_count}-mb{minibatch_index}-dp{self.plugin.dp_rank}"
        return ray.get(self.buffer.get.remote(self.config.batch.train_minibatch_size, request))

    def step(self) -> dict:
        b = self.config.batch
        num_minibatches = b.train_batch_size // b.train_minibatch_size
        start = time.perf_counter()
        stats: list[dict] = []
        groups_seen: list[RolloutGroup] = []
        wait = 0.0
        for index in range(num_minibatches):
            pull_start = time.perf_counter()
            groups = self._pull(index)
            wait += time.perf_counter() - pull_start
            groups_seen.extend(groups)
            batch = self.prepare(collate(groups, self.pad_id), num_minibatches)
            stats += self.plugin.forward_backward(split_micro_batches(batch, b.train_microbatch_size), self.loss_fn)
        grad_norm = self.plugin.optimizer_step(self.config.algo.max_grad_norm)
        self.step_count += 1
        metrics = {name: sum(float(s[name]) for s in stats) for name in stats[0]}
        metrics.update(rollout_metrics(groups_seen, self.version))
        metrics.update(grad_norm=grad_norm, step_time_s=time.perf_counter() - start, buffer_wait_s=wait)
        if self.step_count % self.config.steps_per_sync == 0:
            self.publish_weights()
        metrics["weight_version"] = self.version
        return metrics

    def publish_weights(self) -> None:
        self.version += 1
        if not self.plugin.is_weight_sender:
            return
        ref = ray.put(pack_named_tensors(self.plugin.named_full_tensors()))
        ray.get(self.weight_store.publish.remote(self.version, [ref]))
        self._published = ref

    def save_pretrained(self, path: str) -> str:
        if self.plugin.is_weight_sender:
            self.plugin.save_pretrained(path)
            self.tokenizer.save_pretrained(path)
        return path

    def full_state(self) -> dict[str, torch.Tensor]:
        """Full weights as a plain dict (tests compare them across runs and layouts)."""
        return {name: tensor.clone() for name, tensor in self.plugin.named_full_tensors()}


def rollout_metrics(groups: list[RolloutGroup], current_version: int) -> dict:
    rewards = [r for g in groups for r in g.rewards]
    lengths = [len(r) for g in groups for r in g.responses]
    n = max(len(rewards), 1)
    return {
        "reward": sum(rewards) / n,
        "accuracy": sum(c for g in groups for c in g.correct) / n,
        "format_rate": sum(f for g in groups for f in g.format_ok) / n,
        "response_length": sum(lengths) / n,
        "truncation_rate": sum(f == "length" for g in groups for f in g.finish_reasons) / n,
        "policy_lag": current_version - min((g.policy_version for g in groups), default=current_version),
    }
