"""The trainer actor base: pulls groups from the buffer, runs optimizer steps through a plugin, syncs weights.

One ``step()`` trains on one batch of up to ``tbs`` groups (split into minibatches of ``tMbs`` groups, each
into micro-batches of ``tmbs`` samples for forward/backward): ``ppo_epochs`` optimizer steps over the same
batch, gradients accumulating over all its minibatches.

Drawing a batch (``_pull``): groups come from the buffer and pass the algorithm's ``select_groups`` (e.g.
DAPO's accuracy filter). Without dynamic batching one draw of ``tbs`` groups is the batch, whatever survives.
With dynamic batching the consumer keeps drawing (exactly the deficit each time) until ``tbs`` groups
survive, at most ``max_draw_multiple * tbs`` groups per step; at that bound, or when the producers' data is
exhausted, it trains on what survived, or skips the step (with a reason) when nothing did.

Weight sync (sync mode): producers generate one round (``groups_per_sync`` groups per trainer rank) per
weight version and wait for the next version before the next round. The consumer therefore publishes
whenever it has *drawn* a full round, not every fixed number of steps: after a step that completed a
round, and also in the middle of a step that needs more groups than the current round holds (the weights
published then are the trainer's current ones, so the groups that follow are still on-policy). A step can
never wait for groups whose version it has not published, so filtering cannot deadlock the two sides.
Without filtering this is exactly "every steps_per_sync steps".

``set_total_groups`` tells the consumer how many groups the producers will make in all; ``step()`` returns
None once they are all drawn and trained on. Algorithm specifics (selection, the loss, extra tensors) live
in subclasses.
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
        self.total_groups: int | None = None
        self.drawn_total = 0  # groups drawn from the buffer so far
        self.drawn_since_sync = 0  # groups drawn since the last published weights
        self._draws = 0  # draws in the current step
        self._draw_serial = 0  # draws since the start
        self._published = None  # keeps the newest weights alive in the object store
        self.setup_algorithm()

    def setup_algorithm(self) -> None:
        """Hook for subclasses (e.g. loading a reference model)."""

    def loss_fn(self, logits: torch.Tensor, micro_batch: dict) -> tuple[torch.Tensor, dict]:
        raise NotImplementedError

    def select_groups(self, groups: list[RolloutGroup]) -> tuple[list[RolloutGroup], dict]:
        """Hook: the groups worth training on (e.g. an accuracy filter) and counters to add up per step."""
        return groups, {}

    def build_batches(self, groups: list[RolloutGroup]) -> list[dict[str, torch.Tensor]]:
        """Hook: collated minibatches of ``tMbs`` groups with what the loss needs (normalisers, masks...).

        Called once per step: everything computed here (e.g. reference logprobs) serves every ppo epoch.
        """
        size = self.config.batch.train_minibatch_size
        return [collate(groups[i : i + size], self.pad_id) for i in range(0, len(groups), size)]

    def set_total_groups(self, total: int | None) -> None:
        """Groups this rank will draw in all (None: unbounded); ``step()`` returns None after the last."""
        self.total_groups = total

    def _draw(self, count: int) -> list[RolloutGroup]:
        # Unique per draw (skipped steps do not reuse ids); peers of one data-parallel replica draw in the
        # same order, so they name the same request.
        request = f"draw{self._draw_serial}-dp{self.plugin.dp_rank}"
        self._draw_serial += 1
        self._draws += 1
        groups = ray.get(self.buffer.get.remote(count, request))
        self.drawn_total += len(groups)
        self.drawn_since_sync += len(groups)
        return groups

    def _pull(self) -> tuple[list[RolloutGroup] | None, list[RolloutGroup], dict]:
        """(groups to train on, all groups drawn, draw statistics) for one step; (None, [], {}) when data is exhausted."""
        target = self.config.batch.train_batch_size
        groups_config = self.config.algo.groups
        dynamic = groups_config.dynamic_batching
        max_draw = target * groups_config.max_draw_multiple if dynamic else target
        per_sync = self.config.groups_per_sync
        kept, drawn, counters, self._draws = [], [], {}, 0
        while len(kept) < target and len(drawn) < max_draw:
            remaining = None if self.total_groups is None else self.total_groups - self.drawn_total
            if remaining == 0:
                break
            if self.drawn_since_sync >= per_sync:  # the round is used up: producers need new weights first
                self.publish_weights()
            want = (target - len(kept)) if dynamic else (target - len(drawn))
            count = min(want, max_draw - len(drawn), per_sync - self.drawn_since_sync,
                        remaining if remaining is not None else want)
            groups = self._draw(count)
            drawn.extend(groups)
            survivors, stats = self.select_groups(groups)
            kept.extend(survivors)
            for name, value in stats.items():
                counters[name] = counters.get(name, 0) + value
        if not drawn:
            return None, [], {}
        info = {"groups_drawn": len(drawn), "groups_kept": len(kept), "draws": self._draws, **counters,
                "draw_limit_hit": int(dynamic and len(kept) < target and len(drawn) >= max_draw),
                "data_exhausted": int(len(kept) < target and self.total_groups is not None
                                      and self.drawn_total >= self.total_groups)}
        return kept, drawn, info

    def step(self) -> dict | None:
        """One training step (``ppo_epochs`` optimizer steps on one batch); None when the data is exhausted.

        A step whose batch is empty after selection changes no weight and returns ``{"skipped": reason}``.
        """
        start = time.perf_counter()
        groups, drawn, info = self._pull()
        if groups is None:
            return None
        wait = time.perf_counter() - start
        metrics: dict = {}
        if not groups:
            reason = (f"all {len(drawn)} groups drawn this step were filtered out"
                      + (" (draw limit max_draw_multiple*tbs reached)" if info["draw_limit_hit"] else "")
                      + (" (no data left)" if info["data_exhausted"] else ""))
            metrics.update(skipped=reason)
        else:
            batches = self.build_batches(groups)
            epochs = self.config.algo.ppo_epochs
            totals: dict[str, float] = {}
            grad_norms = []
            for _ in range(epochs):
                stats: list[dict] = []
                for batch in batches:
                    stats += self.plugin.forward_backward(split_micro_batches(batch, self.config.batch.train_microbatch_size),
                                                          self.loss_fn)
                grad_norms.append(self.plugin.optimizer_step(self.config.algo.max_grad_norm))
                for name in stats[0]:
                    totals[name] = totals.get(name, 0.0) + sum(float(s[name]) for s in stats)
            # Per-epoch means; grad_norm is the first epoch's (later epochs see the same data again).
            metrics.update({name: value / epochs for name, value in totals.items()})
            metrics.update(grad_norm=grad_norms[0], optimizer_steps=epochs)
            self.step_count += 1
        metrics.update(info)
        metrics.update(rollout_metrics(drawn, self.version))
        metrics.update(step_time_s=time.perf_counter() - start, buffer_wait_s=wait)
        if self.drawn_since_sync >= self.config.groups_per_sync:
            self.publish_weights()
        metrics["weight_version"] = self.version
        return metrics

    def publish_weights(self) -> None:
        self.version += 1
        self.drawn_since_sync = 0
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
