"""The trainer actor base: pulls groups from the buffer, runs optimizer steps through a plugin, syncs weights.

A *trainer group* is ``-t`` of these actors forming one ``torch.distributed`` group (gloo on CPU, nccl on
GPU) laid out by the plugin as ``dp x pp x tp``. Every rank of the group reads the *same* groups from the
buffer (one shared request per draw), so every decision that depends on the data (what DAPO's filter keeps,
when to publish weights, whether to skip a step, when the data is exhausted) is taken identically on every
rank without extra communication; each data-parallel rank then trains on its own contiguous share of the
kept groups. Shares are padded with loss-masked copies to equal size so that every rank makes the same
sequence of collective calls (FSDP2 / ZeRO gather and reduce per micro-batch).

One ``step()`` trains on one batch of ``dp * tbs * G`` samples (each dp rank's share split into minibatches
of ``tMbs * G`` samples, each into micro-batches of ``tmbs`` samples; ``tmbs // pp`` under pipeline
parallelism): ``ppo_epochs`` optimizer steps over the same batch, gradients accumulating over all its
minibatches. When a round feeds several steps (round-level minibatches, the default: round_batches.py) the
round is drawn at its first step and each step trains a random part of its samples, shared by rows; with
``--no-round-minibatches``, or one step per round, a step's batch is ``dp * tbs`` whole groups in draw order.

Drawing a batch (``_pull``, for a step or a whole round): groups come from the buffer and pass the algorithm's ``select_groups`` (e.g.
DAPO's accuracy filter). Without dynamic batching one draw of ``dp * tbs`` groups is the batch, whatever
survives. With dynamic batching the group keeps drawing (exactly the deficit each time) until ``dp * tbs``
groups survive, at most ``max_draw_multiple`` times that per step; at that bound, or when the producers' data
is exhausted, it trains on what survived, or skips the step (with a reason) when nothing did.

Weight sync (sync mode): producers generate one round (``groups_per_sync`` groups in all) per weight version
and wait for the next version before the next round. The group therefore publishes whenever it has *drawn*
a full round, not every fixed number of steps: after a step that completed a round, and also in the middle
of a step that needs more groups than the current round holds (the weights published then are the current
ones, so the groups that follow are still on-policy). A step can never wait for groups whose version it has
not published, so filtering cannot deadlock the two sides. Without filtering this is exactly "every
steps_per_sync steps". Publishing is collective (sharded weights are gathered); only the sender sends them, through
its publisher (``--weight-sync``: the object store, or a broadcast group with the producers; weight_sync.py).

Learner-side generation (``--learner-chunk-size N``, see own_rounds.py): the sender also generates N
groups of every round with the weights it has just published, puts them into the buffer before its first draw
of the round, and refreshes its inference engine from the tensors it gathers when publishing.

Colocated generation (``--colocate``, see colocated.py): there are no producers; every rank generates its share
of each round at the same point (before its first draw of the round), and a publish loads the new weights into
every rank's own engine instead of sending them anywhere.

``set_total_groups`` tells the consumer how many groups the producers will make in all; ``step()`` returns
None once they are all drawn and trained on. The algorithm's part of a step (selection, advantages, masks, the
losses, extra roles such as PPO's critic) is the object its family names in ``STEP_ALGORITHMS``
(step_algorithm.py); this class is the same for all of them.
"""

from __future__ import annotations

import dataclasses
import time

import ray
import torch

from coati.algorithm.batch import (micro_batch_count, split_micro_batches, token_budget_micro_batches,
                                   with_logits_window)
from coati.cluster.trainer_group import rendezvous_address
from coati.cluster.weight_sync import make_publisher, pack_named_tensors
from coati.registry.weight_sync import weight_sync_spec
from coati.config.algo import estimator_family
from coati.config.batch_defaults import micro_batch_tokens
from coati.config.tree import RLConfig
from coati.models.lora import merged_tensors
from coati.plugins.dist import agree_max, all_reduce_stats
from coati.plugins.mesh import TrainerMesh
from coati.rollout.group import RolloutGroup
from coati.rollout.rollout_log import rollout_log_due, rollout_records
from coati.trainer.critic_algorithm import CriticAlgorithm
from coati.trainer.group_algorithm import GroupAlgorithm
from coati.trainer.roles import ACTOR, TrainedModel, grad_norm_name
from coati.trainer.step_algorithm import StepAlgorithm
from coati.trainer.round_batches import RoundPool, parts_of_round, round_part
from coati.trainer.step_data import StepWork, rollout_metrics, share_bounds
from coati.utils.device import device_memory_metrics
from coati.utils.actor_process import start_actor_process
from coati.utils.machine import usable_cores

# The advantage estimator's family (config.algo.estimator_family) -> what a step asks of the algorithm.
STEP_ALGORITHMS: dict[str, type[StepAlgorithm]] = {"group": GroupAlgorithm, "critic": CriticAlgorithm}


class Consumer:
    def __init__(self, config: RLConfig, rank: int, buffer, weight_store, num_threads: int | None = None):
        start_actor_process()
        self.config, self.rank, self.buffer, self.weight_store = config, rank, buffer, weight_store
        self.steps_begun = 0  # noted in the buffer: the driver's way to tell a stuck rank from its waiting peers
        self.num_threads = num_threads or usable_cores()
        torch.set_num_threads(self.num_threads)
        self.plugin = None
        self.mesh = None  # the trainer group's TrainerMesh, shared by every role's plugin
        self.roles: dict[str, TrainedModel] = {}  # the policy first, then e.g. a critic (roles.py)
        self.step_count = 0
        self.version = 0
        self.total_groups: int | None = None
        self.drawn_total = 0  # groups drawn from the buffer so far (the whole group's, equal on every rank)
        self.drawn_since_sync = 0  # groups drawn since the last published weights
        self._draws = 0  # draws in the current step
        self._draw_serial = 0  # draws since the start
        self.publisher = None  # the sender's end of the weight sync (weight_sync.make_publisher)
        self._published_version = 0  # the newest published version (tracked on every rank)
        # Whether an optimizer step moved the weights since they were version ``self.version`` (a resumed run
        # cannot tell: it waits for its next publish). Only rows sampled by exactly these weights are checked.
        self._trained_since_version = False
        self.learner = None  # LearnerRounds on the weight sender when --learner-chunk-size > 0
        self.colocated = None  # ColocatedGenerator on every rank with --colocate
        self.algorithm: StepAlgorithm | None = None
        self.publish_s = 0.0  # seconds spent publishing weights since the last step's metrics
        self._staleness: list[int] = []  # per kept group of the current draw: versions behind the trainer
        # Round-level minibatches (round_batches.py): steps a round feeds, the round being trained, rounds drawn
        self.round_steps = config.steps_per_sync if config.batch.round_minibatches else 1
        self.round: RoundPool | None = None
        self.round_serial = 0

    def rendezvous_address(self) -> tuple[str, int]:
        """(address, port) for the trainer group's rendezvous, hosted by this actor (rank 0) on its own node:
        the port is --master_port or a free one."""
        return rendezvous_address(self.config.run.master_port)

    def setup(self, master_address: str | None = None, master_port: int | None = None) -> None:
        """Join the trainer group (every rank at once), build the plugin and the policy, then the algorithm."""
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        config, p = self.config, self.config.parallel
        torch.manual_seed(config.run.seed)  # the same on every rank: any fresh parameter starts identical
        self.tokenizer = AutoTokenizer.from_pretrained(config.model.path)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        model_config = AutoConfig.from_pretrained(config.model.path)
        if p.plugin_spec.distributed:
            from coati.plugins.dist import init_trainer_group

            init_trainer_group(self.rank, p.num_trainers, master_address or "127.0.0.1", master_port or 29506)
        self.mesh = TrainerMesh.build(p.parallel_dims)
        model = AutoModelForCausalLM.from_pretrained(config.model.path, dtype=p.model_placement("policy").dtype)
        # the policy's loss function is the algorithm's objective, built below once this plugin exists (a LoRA
        # policy's plugin also serves the objective's reference)
        self.roles[ACTOR] = TrainedModel.build(ACTOR, p, model, config.algo.learning_rate, None, model_config,
                                               mesh=self.mesh, optim=config.algo.optim, lora=config.model.lora)
        self.plugin = self.roles[ACTOR].plugin  # the policy's: it sets the data-parallel shares and is published
        if self.plugin.is_weight_sender and not p.colocate:
            self.publisher = make_publisher(p.weight_sync, self.weight_store, p.num_inferencers,
                                            p.weight_sync_bucket_mb, p.weight_sync_timeout_s)
        if config.algo.learner_chunk_size > 0 and self.plugin.is_weight_sender:
            from coati.trainer.own_rounds import LearnerRounds

            self.learner = LearnerRounds(config)
        torch.manual_seed(config.run.seed + self.rank)
        self.algorithm = STEP_ALGORITHMS[estimator_family(config.algo.groups.advantage)](self)
        self.roles[ACTOR].loss_fn = self.algorithm.objective.loss
        if p.colocate:  # after the algorithm: its extra roles (PPO's critic) hand over memory too
            from coati.trainer.colocated import ColocatedGenerator

            self.colocated = ColocatedGenerator(config, self.rank, self.plugin, self.tokenizer,
                                                [role.plugin for role in self.roles.values()])

    def learner_info(self) -> dict | None:
        """This rank's own generator's shard (prompts, rounds per episode): the learner-side generator on the rank
        that owns it, or this rank's colocated generator; else None."""
        if self.learner is not None:  # its own engine, in the dtype the device rule gives it
            return self.learner.info()
        return self.colocated.info() if self.colocated is not None else None  # the trained module itself

    def add_role(self, name: str, model: torch.nn.Module, learning_rate: float, loss_fn,
                 trained_modules: tuple[str, ...] = ()) -> TrainedModel:
        """Train ``model`` beside the policy, on the same ranks and layout (collective: every rank adds it); with
        LoRA, adapters on it too, and ``trained_modules`` (e.g. a fresh head) trained in full."""
        self.roles[name] = TrainedModel.build(name, self.config.parallel, model, learning_rate, loss_fn, mesh=self.mesh,
                                              optim=self.config.algo.optim, lora=self.config.model.lora,
                                              trained_modules=trained_modules)
        return self.roles[name]

    def set_total_groups(self, total: int | None) -> None:
        """Groups the trainer group will draw in all (None: unbounded); ``step()`` returns None after the last."""
        self.total_groups = total

    @property
    def _dp_size(self) -> int:
        return self.plugin.dp_size if self.plugin is not None else 1

    def _draw(self, count: int) -> list[RolloutGroup]:
        # One request per draw, read by every rank of the group (the first caller pops, the rest get a copy);
        # ids are unique per draw, so skipped steps do not reuse them.
        request = f"draw{self._draw_serial}"
        self._draw_serial += 1
        self._draws += 1
        world = self.plugin.world_size if self.plugin is not None else 1
        groups = ray.get(self.buffer.get.remote(count, request, world))
        self.drawn_total += len(groups)
        self.drawn_since_sync += len(groups)
        return groups

    def _pull(self, target: int) -> tuple[list[RolloutGroup] | None, list[RolloutGroup], dict]:
        """(``target`` groups to train on, all groups drawn, draw statistics); (None, [], {}) when data is exhausted."""
        groups_config = self.config.algo.groups
        dynamic = groups_config.dynamic_batching
        max_draw = target * groups_config.max_draw_multiple if dynamic else target
        schedule = self.config.schedule
        kept, drawn, counters, self._draws, self._staleness = [], [], {}, 0, []
        while len(kept) < target and len(drawn) < max_draw:
            remaining = None if self.total_groups is None else self.total_groups - self.drawn_total
            if remaining == 0:
                break
            if schedule.publish_due(self.drawn_since_sync):  # the round is used up: producers need new weights
                self.publish_weights()
            want = (target - len(kept)) if dynamic else (target - len(drawn))
            count = min(want, max_draw - len(drawn), schedule.draw_limit(self.drawn_since_sync),
                        remaining if remaining is not None else want)
            for generator in (self.learner, self.colocated):  # the version's round starts: add this rank's groups
                if generator is not None:
                    generator.fill(self.buffer, schedule.own_round(self.version), self.version)
            groups = self._draw(count)
            drawn.extend(groups)
            survivors, stats = self.algorithm.select_groups(groups)
            kept.extend(survivors)
            self._staleness += [schedule.staleness(self.version, g.policy_version) for g in survivors]
            for name, value in stats.items():
                counters[name] = counters.get(name, 0) + value
        if not drawn:
            return None, [], {}
        info = {"groups_drawn": len(drawn), "groups_kept": len(kept), "draws": self._draws, **counters,
                "draw_limit_hit": int(dynamic and len(kept) < target and len(drawn) >= max_draw),
                "data_exhausted": int(len(kept) < target and self.total_groups is not None
                                      and self.drawn_total >= self.total_groups)}
        return kept, drawn, info

    def _share(self, kept: list[RolloutGroup]) -> tuple[list[RolloutGroup], int]:
        """This data-parallel rank's contiguous share of ``kept``, padded with copies of a kept group to the
        largest share's size (every rank must make the same collective calls); (share, padding)."""
        dp = self._dp_size
        size = -(-len(kept) // dp)
        start, end = share_bounds(len(kept), dp, self.plugin.dp_rank if self.plugin is not None else 0)
        share = kept[start:end]
        padding = size - len(share)
        return share + [dataclasses.replace(kept[0]) for _ in range(padding)], padding

    def _micro_batch_samples(self) -> int:
        pp = self.config.parallel.pipeline_parallel_size
        return max(1, self.config.batch.train_microbatch_size // pp)  # ColossalChat's microbatch_size = tmbs // pp

    def _micro_batches(self, batch: dict) -> list[dict]:
        """This rank's micro-batches of a minibatch. Where every role's plugin takes micro-batches of any shape: by
        token budget (``micro_batch_tokens``), longest rows first, each cut to its own longest row and naming the
        logits its loss reads; as many on every rank (collective: the largest count). Else ``tmbs`` rows each."""
        if not all(role.plugin.ragged_micro_batches for role in self.roles.values()):
            return split_micro_batches(batch, self._micro_batch_samples())
        budget = micro_batch_tokens(self.config)
        count = agree_max(micro_batch_count(batch, budget))
        return [with_logits_window(micro) for micro in token_budget_micro_batches(batch, budget, count)]

    def _whole_groups(self) -> StepWork | None:
        """One step's whole groups in draw order (``--no-round-minibatches``, or a round of one step)."""
        groups, drawn, info = self._pull(self.config.batch.train_batch_size * self._dp_size)
        if groups is None:
            return None
        share, padding = self._share(groups) if groups else ([], 0)
        info = {**info, **rollout_metrics(drawn, self.version)}
        return StepWork(share=share, kept=groups, padding=padding, info=info, staleness=self._staleness,
                        prompts=len(groups), samples=sum(len(g.responses) for g in groups), drawn=drawn, groups=groups)

    def _round_part(self) -> StepWork | None:
        """The next part of the current round, drawing the round first when the last one is used up."""
        first = self.round is None
        if first:
            target = self.config.batch.train_batch_size * self._dp_size
            kept, drawn, info = self._pull(target * self.round_steps)
            if kept is None:
                return None
            if not kept:
                return StepWork(share=[], kept=[], padding=0, info={**info, **rollout_metrics(drawn, self.version)},
                                staleness=[], prompts=0, samples=0, drawn=drawn)
            parts = parts_of_round(len(kept), target, self.round_steps)
            self.round = RoundPool.build(self.round_serial, self.config.run.seed, kept, drawn, info, self._staleness,
                                         parts, self.version)
            self.round.tensors = self.algorithm.round_tensors(kept)
            self.round_serial += 1
        work = round_part(self.round, self._dp_size, self.plugin.dp_rank if self.plugin is not None else 0)
        if first:  # the rollout log records the whole round at its first step, if any of its steps is due
            work.drawn, work.groups, work.log_steps = drawn, kept, self.round.parts
        if self.round.done:
            self.round = None
        return work

    def step(self) -> dict | None:
        """One training step (``ppo_epochs`` optimizer steps on one batch); None when the data is exhausted.

        A step whose batch is empty after selection changes no weight and returns ``{"skipped": reason}``.
        Collective: every rank of the trainer group calls it the same number of times.
        """
        start = time.perf_counter()
        self.steps_begun += 1
        self.buffer.note.remote(("trainer rank", self.rank), self.steps_begun)  # not awaited: the buffer answers
        work = self._round_part() if self.round_steps > 1 else self._whole_groups()
        if work is None:
            return None
        learner_s = self.learner.take_time() if self.learner is not None else 0.0
        generate_s = self.colocated.take_time() if self.colocated is not None else 0.0
        # neither mid-step publishes nor this rank's own generation are waiting
        wait = time.perf_counter() - start - learner_s - generate_s - self.publish_s
        metrics: dict = {}
        info = work.info
        if not work.kept:
            reason = (f"all {len(work.drawn)} groups drawn this step were filtered out"
                      + (" (draw limit max_draw_multiple*tbs reached)" if info["draw_limit_hit"] else "")
                      + (" (no data left)" if info["data_exhausted"] else ""))
            metrics.update(skipped=reason)
        else:
            batches = self.algorithm.build_batches(work.share, work.kept, work.padding, work.rows)
            epochs = self.config.algo.ppo_epochs
            if self.colocated is not None:
                self.colocated.phases.train()
            metrics.update(self._schedule_learning_rates())
            train_start = time.perf_counter()
            self.algorithm.objective.delivery_version = None if self._trained_since_version else self.version
            totals, grad_norms = self._train_epochs(batches, epochs)
            self._trained_since_version = True
            totals, maxima = self._reduce_stats(totals), self.algorithm.max_stats
            # Per-epoch means (maxima as they are); grad norms are the first epoch's (later epochs see the same data).
            metrics.update({name: value if name in maxima else value / epochs for name, value in totals.items()})
            if metrics.get("delivery_gap", 0.0) < 0:  # no row of this step was sampled by the current weights
                del metrics["delivery_gap"]
            elif "delivery_gap" in metrics:
                metrics["delivery_version"] = self.algorithm.objective.delivery_version
            metrics.update({grad_norm_name(name): norms[0] for name, norms in grad_norms.items()})
            metrics.update(optimizer_steps=epochs, train_s=time.perf_counter() - train_start)
            metrics.update(staleness_mean=sum(work.staleness) / len(work.staleness),
                           staleness_max=max(work.staleness), prompts=work.prompts, samples=work.samples)
            self.step_count += 1
        metrics.update(info)
        if self.round is None and self.config.schedule.publish_due(self.drawn_since_sync):
            self.publish_weights()
        metrics.update(step_time_s=time.perf_counter() - start, buffer_wait_s=wait, publish_s=self.publish_s)
        metrics.update(device_memory_metrics())
        self.publish_s = 0.0
        if work.groups and self.rank == 0 and any(rollout_log_due(self.config, self.step_count + k)
                                                  for k in range(work.log_steps)):
            metrics["rollouts"] = rollout_records(self.step_count, work.drawn, work.groups,
                                                 *self.algorithm.rollout_tensors(work.groups))
        if self.config.algo.learner_chunk_size > 0:
            metrics.update(learner_groups=sum(g.learner for g in work.drawn), learner_gen_s=learner_s)
        if self.colocated is not None:
            metrics.update(generate_s=generate_s, **self.colocated.phases.take_peaks())
        metrics["weight_version"] = self.version
        self.algorithm.finish_step(metrics)
        return metrics

    def _schedule_learning_rates(self) -> dict[str, float]:
        """Every role's learning rate for this step, over the planned steps (--max-steps or the groups the run
        draws); nothing changes while the total is unknown."""
        if self.total_groups is None:
            return {}
        planned = self.total_groups // (self._dp_size * self.config.batch.train_batch_size)
        total = self.config.algo.optim.schedule_horizon(planned)
        rates = {name: role.schedule_learning_rate(self.step_count, total) for name, role in self.roles.items()}
        return {("lr" if name == ACTOR else f"{name}_lr"): rate for name, rate in rates.items()}

    def _train_epochs(self, batches: list[dict], epochs: int) -> tuple[dict[str, float], dict[str, list[float]]]:
        """Train every role for ``epochs`` optimizer steps on ``batches``; (this rank's summed statistics, each
        role's gradient norm per epoch)."""
        totals: dict[str, float] = {}
        grad_norms: dict[str, list[float]] = {name: [] for name in self.roles}
        split = [self._micro_batches(batch) for batch in batches]  # every epoch the same, in the same order
        for epoch in range(epochs):
            self.algorithm.objective.begin_epoch(epoch)
            stats: list[dict] = []
            for micro_batches in split:
                for role in self.roles.values():  # each role's statistics have names of their own
                    stats += role.plugin.forward_backward(micro_batches, role.loss_fn)
            for name, role in self.roles.items():
                grad_norms[name].append(role.plugin.optimizer_step(self.config.algo.max_grad_norm))
            for name in dict.fromkeys(key for s in stats for key in s):
                values = [float(s[name]) for s in stats if name in s]
                if name in self.algorithm.max_stats:
                    totals[name] = max([totals.get(name, float("-inf"))] + values)
                else:
                    totals[name] = totals.get(name, 0.0) + sum(values)
        return totals, grad_norms

    def _reduce_stats(self, totals: dict[str, float]) -> dict[str, float]:
        """Statistics of the whole step (normalised ones averaged over dp, counts summed, maxima the largest)."""
        return all_reduce_stats(totals, self.mesh, self.algorithm.summed_stats, self.algorithm.max_stats)

    def publish_weights(self) -> None:
        """Collective: every rank takes part in gathering the full weights; the sender puts them in the store."""
        start = time.perf_counter()
        try:
            self._publish()
        finally:
            self.publish_s += time.perf_counter() - start

    def _publish(self) -> None:
        self.version += 1
        self.drawn_since_sync = 0
        self._trained_since_version = False
        self._published_version = self.version  # on every rank (the publisher lives on the sender only)
        if self.colocated is not None:  # nobody else generates: the new weights go into each rank's own engine
            self.colocated.load_weights()
            return
        tensors = self._version_tensors()
        if tensors is None:
            return
        self.publisher.publish(self.version, tensors)
        if self.learner is not None:  # after the producers got theirs: the learner's next round uses these too
            self.learner.load_weights(tensors)

    def snapshot_weights(self) -> tuple[int, list | None, bool]:
        """Collective: the current weights for an evaluation, as (newest published version, [ref] on the
        sender else None, whether the weights are exactly that version). Evaluation always reads the object
        store, whatever ``--weight-sync`` is (evaluator.py: it must see weights that were never published, and
        never hold up a publish). Right after an object-store publish (nothing drawn since) the published object
        is reused; otherwise the full weights are gathered once more. The branch depends only on settings and
        counters equal on every rank, so all ranks make the same collective calls."""
        on_sync = self._published_version == self.version > 0 and self.drawn_since_sync == 0
        if on_sync and weight_sync_spec(self.config.parallel.weight_sync).keeps_published_object:
            return self.version, [self.publisher.published] if self.plugin.is_weight_sender else None, True
        tensors = self._version_tensors()
        if tensors is None:
            return self.version, None, on_sync
        return self.version, [ray.put(pack_named_tensors(tensors))], on_sync

    def _version_tensors(self) -> list | None:
        """Collective: one weight version as the engines load it, on the sender (None elsewhere): the trained
        tensors (with LoRA the adapters alone), or full weights merged from the adapters for an engine that
        takes no adapters (``RLConfig.merges_adapters``)."""
        merge = self.config.merges_adapters
        tensors = self.plugin.named_full_tensors(include_frozen=merge)
        if not self.plugin.is_weight_sender:
            for _ in tensors:  # non-senders yield nothing but must run the gathers
                pass
            return None
        return list(merged_tensors(tensors, self.config.model.lora) if merge else tensors)

    def evaluate(self, path: str, params) -> dict | None:
        """Collective (--colocate): the current weights into every rank's engine, then rank 0 evaluates a held-out
        file with them (the result on rank 0, with ``on_sync``: whether they are exactly the newest published
        version; None elsewhere)."""
        self.colocated.load_weights()
        if self.rank != 0:
            return None
        on_sync = self._published_version == self.version and self.drawn_since_sync == 0
        return {**self.colocated.evaluate(path, params, self.version), "on_sync": on_sync}

    def save_pretrained(self, path: str) -> str:
        """Collective: the policy as an HF directory (the sender writes it, with the tokenizer)."""
        self.plugin.save_pretrained(path)
        if self.plugin.is_weight_sender:
            self.tokenizer.save_pretrained(path)
        return path

    def save_checkpoint(self, staging: str) -> dict:
        """Collective: this rank's part of a run checkpoint (coati.trainer.checkpointing); the counters."""
        from coati.trainer.checkpointing import save_consumer

        return save_consumer(self, staging)

    def load_checkpoint(self, path: str) -> dict:
        """Collective, after ``setup``: continue from a run checkpoint of any layout the plugin reads."""
        from coati.trainer.checkpointing import load_consumer

        counters = load_consumer(self, path)  # which publishes the loaded weights again under their version
        # Rows sampled before the checkpoint (a round's rest) came from the version's first weights, not these:
        # the check resumes at the next publish.
        self._trained_since_version = True
        return counters

    def full_state(self, role: str = ACTOR) -> dict[str, torch.Tensor]:
        """Full weights of a trained model as a plain dict on the sender (tests compare them across runs and
        layouts); collective."""
        return {name: tensor.clone() for name, tensor in self.roles[role].plugin.named_full_tensors()}

    def shutdown(self) -> None:
        """Close the weight sync, leave the trainer group: release the plugin, then the default process group."""
        if self.publisher is not None:
            self.publisher.close()
            self.publisher = None
        for role in self.roles.values():
            role.close()
        if self.mesh is not None:
            self.mesh.close()
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
