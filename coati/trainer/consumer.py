"""The trainer actor: one rank of the trainer group, a thin shell that wires three parts together per step.

A *trainer group* is ``-t`` of these actors forming one ``torch.distributed`` group (gloo on CPU, nccl on
GPU) laid out by the plugin as ``dp x pp x tp``. ``step()`` is:

    RolloutFeed.next_step   (rollout_feed.py: draw, filter, dynamic batching, round permutation, share by dp)
    Learner.train_step      (learner.py: minibatches -> epochs x micro-batches -> optimizer steps -> metrics)
    WeightPublisher.publish (weight_publisher.py: when a round is used up; also from inside the feed's draws)

over one ``TrainState`` (train_state.py: step, version, draw and round counters, the round in progress, RNG),
which is what a checkpoint keeps of a rank (checkpointing.py). One ``step()`` trains on one batch of
``dp * tbs * G`` samples: ``ppo_epochs`` optimizer steps over the same batch.

Learner-side generation (``--learner-chunk-size N``, see own_rounds.py): the sender also generates N groups of
every round with the weights it has just published, puts them into the buffer before its first draw of the round,
and refreshes its inference engine from the tensors it gathers when publishing. Colocated generation
(``--colocate``, see colocated.py): there are no producers; every rank generates its share of each round at the
same point, and a publish loads the new weights into every rank's own engine instead of sending them anywhere.

``set_total_groups`` tells the consumer how many groups the producers will make in all; ``step()`` returns
None once they are all drawn and trained on. The algorithm's part of a step (selection, advantages, masks, the
losses, extra roles such as PPO's critic) is the object its family names in ``STEP_ALGORITHMS``
(step_algorithm.py), which sees the group only through a ``StepContext``; this class is the same for all of them.
"""

from __future__ import annotations

import time

import torch

from coati.config.algo import estimator_family
from coati.config.tree import RLConfig
from coati.plugins.dist import all_reduce_stats
from coati.rollout.rollout_log import rollout_log_due, rollout_records
from coati.trainer.critic_algorithm import CriticAlgorithm
from coati.trainer.group_algorithm import GroupAlgorithm
from coati.trainer.learner import Learner, layout_checks
from coati.trainer.rank import TrainerRank
from coati.trainer.roles import ACTOR, TrainedModel
from coati.trainer.rollout_feed import RolloutFeed
from coati.trainer.step_algorithm import StepAlgorithm, StepContext
from coati.trainer.train_state import TrainState
from coati.trainer.weight_publisher import WeightPublisher
from coati.utils.device import device_memory_metrics
from coati.utils.machine import usable_cores

# The advantage estimator's family (config.algo.estimator_family) -> what a step asks of the algorithm.
STEP_ALGORITHMS: dict[str, type[StepAlgorithm]] = {"group": GroupAlgorithm, "critic": CriticAlgorithm}


class Consumer(TrainerRank):
    def __init__(self, config: RLConfig, rank: int, buffer, weight_store, num_threads: int | None = None):
        super().__init__(rank, num_threads or usable_cores(), parts=config.parts)
        self.config, self.buffer, self.weight_store = config, buffer, weight_store
        self.master_port = config.run.master_port
        self.steps_begun = 0  # noted in the buffer: the driver's way to tell a stuck rank from its waiting peers
        self.state = TrainState()
        self.learner_rounds = None  # LearnerRounds on the weight sender when --learner-chunk-size > 0
        self.colocated = None  # ColocatedGenerator on every rank with --colocate
        self.algorithm: StepAlgorithm | None = None
        self.weights: WeightPublisher | None = None
        self.feed: RolloutFeed | None = None
        self.learner: Learner | None = None
        self.layout_checks: tuple[str, ...] = ()  # the layouts every role's model is checked for (layout_checks)

    def setup(self, master_address: str | None = None, master_port: int | None = None) -> None:
        """Join the trainer group (every rank at once), build the plugin and the policy, the algorithm, then the
        feed, the learner and the weight publisher around them."""
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        from coati.models.families import load_options

        config, p = self.config, self.config.parallel
        torch.manual_seed(config.run.seed)  # the same on every rank: any fresh parameter starts identical
        self.tokenizer = AutoTokenizer.from_pretrained(config.model.path)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        model_config = AutoConfig.from_pretrained(config.model.path)
        self.join_group(p, master_address or "127.0.0.1", master_port or 29506)
        model = AutoModelForCausalLM.from_pretrained(config.model.path, dtype=p.model_placement("policy").dtype,
                                                     **load_options(model_config))
        # the policy's loss function is the algorithm's objective, built below once this plugin exists (a LoRA
        # policy's plugin also serves the objective's reference)
        self.layout_checks = layout_checks(config, model)
        self.plugin = self.add_role(ACTOR, model, config.algo.learning_rate, None, model_config=model_config).plugin
        if config.algo.learner_chunk_size > 0 and self.plugin.is_weight_sender:
            from coati.trainer.own_rounds import LearnerRounds

            self.learner_rounds = LearnerRounds(config)
        torch.manual_seed(config.run.seed + self.rank)
        mesh = self.mesh
        context = StepContext(config, self.rank, self.plugin.dp_size, self.plugin.dp_rank, self.pad_id, self.plugin,
                              lambda totals, summed=(), maxima=(): all_reduce_stats(totals, mesh, summed, maxima),
                              self.add_role)
        self.algorithm = STEP_ALGORITHMS[estimator_family(config.algo.groups.advantage)](context)
        self.roles[ACTOR].loss_fn = self.algorithm.objective.loss
        if p.colocate:  # after the algorithm: its extra roles (PPO's critic) hand over memory too
            from coati.trainer.colocated import ColocatedGenerator

            self.colocated = ColocatedGenerator(config, self.rank, self.plugin, self.tokenizer,
                                                [role.plugin for role in self.roles.values()])
        self.weights = WeightPublisher(config, self.state, self.plugin, self.weight_store, self.learner_rounds,
                                       self.colocated)
        generators = [g for g in (self.learner_rounds, self.colocated) if g is not None]
        self.feed = RolloutFeed(config, self.state, self.buffer, self.algorithm,
                                (self.plugin.world_size, self.plugin.dp_size, self.plugin.dp_rank), generators,
                                self.weights.publish)
        self.learner = Learner.for_run(config, self.state, self.roles, self.algorithm, context)

    def micro_batching_line(self) -> str:
        """How this rank cuts its minibatches into micro-batches (the layout the rule chose, and why; whether samples
        without a gradient are left out), for the run's log."""
        idle = "; samples with advantage 0 (no gradient) left out" if self.algorithm.skip_idle else ""
        return self.learner.layout_choice.line() + idle

    def learner_info(self) -> dict | None:
        """This rank's own generator's shard (prompts, rounds per episode): the learner-side generator on the rank
        that owns it, or this rank's colocated generator; else None."""
        if self.learner_rounds is not None:  # its own engine, in the dtype the device rule gives it
            return self.learner_rounds.info()
        return self.colocated.info() if self.colocated is not None else None  # the trained module itself

    def add_role(self, name: str, model: torch.nn.Module, learning_rate: float, loss_fn,
                 trained_modules: tuple[str, ...] = (), model_config=None) -> TrainedModel:
        """Train ``model`` beside the policy, on the same ranks and layout (collective: every rank adds it); with
        LoRA, adapters on it too, and ``trained_modules`` (e.g. a fresh head) trained in full. Its model is checked
        for the policy's candidate micro-batch layouts (``layout_checks``)."""
        self.roles[name] = TrainedModel.build(name, self.config.parallel, model, learning_rate, loss_fn, model_config,
                                              mesh=self.mesh, optim=self.config.algo.optim,
                                              lora=self.config.model.lora, trained_modules=trained_modules,
                                              check_layouts=self.layout_checks)
        return self.roles[name]

    def set_total_groups(self, total: int | None) -> None:
        """Groups the trainer group will draw in all (None: unbounded); ``step()`` returns None after the last."""
        self.feed.total_groups = total
        per_step = self.plugin.dp_size * self.config.batch.train_batch_size  # the LR schedule's horizon
        self.learner.planned_steps = None if total is None else total // per_step

    def step(self) -> dict | None:
        """One training step (``ppo_epochs`` optimizer steps on one batch); None when the data is exhausted.

        A step whose batch is empty after selection changes no weight and returns ``{"skipped": reason}``.
        Collective: every rank of the trainer group calls it the same number of times.
        """
        start = time.perf_counter()
        self.steps_begun += 1
        self.buffer.note.remote(("trainer rank", self.rank), self.steps_begun)  # not awaited: the buffer answers
        work = self.feed.next_step()
        if work is None:
            return None
        learner_s = self.learner_rounds.take_time() if self.learner_rounds is not None else 0.0
        generate_s = self.colocated.take_time() if self.colocated is not None else 0.0
        # neither mid-step publishes nor this rank's own generation are waiting
        wait = time.perf_counter() - start - learner_s - generate_s - self.weights.seconds
        metrics: dict = {}
        if not work.kept:
            info = work.info
            metrics.update(skipped=f"all {len(work.drawn)} groups drawn this step were filtered out"
                           + (" (draw limit max_draw_multiple*tbs reached)" if info["draw_limit_hit"] else "")
                           + (" (no data left)" if info["data_exhausted"] else ""))
        else:
            if self.colocated is not None:
                self.colocated.phases.train()
            metrics.update(self.learner.train_step(work))
            metrics.update(staleness_mean=sum(work.staleness) / len(work.staleness),
                           staleness_max=max(work.staleness), prompts=work.prompts, samples=work.samples)
        metrics.update(work.info)
        if self.state.round is None and self.config.schedule.publish_due(self.state.drawn_since_sync):
            self.weights.publish()
        metrics.update(step_time_s=time.perf_counter() - start, buffer_wait_s=wait, publish_s=self.weights.take_seconds())
        metrics.update(device_memory_metrics())
        if work.groups and self.rank == 0 and any(rollout_log_due(self.config, self.state.step + k)
                                                  for k in range(work.log_steps)):
            metrics["rollouts"] = rollout_records(self.state.step, work.drawn, work.groups,
                                                 *self.algorithm.rollout_tensors(work.groups))
        if self.config.algo.learner_chunk_size > 0:
            metrics.update(learner_groups=sum(g.learner for g in work.drawn), learner_gen_s=learner_s)
        if self.colocated is not None:
            metrics.update(generate_s=generate_s, **self.colocated.phases.take_peaks())
        metrics["weight_version"] = self.state.version
        self.algorithm.finish_step(metrics)
        return metrics

    def snapshot_weights(self) -> tuple[int, list | None, bool]:
        """Collective: the current weights for an evaluation (WeightPublisher.snapshot)."""
        return self.weights.snapshot()

    def evaluate(self, path: str, params) -> dict | None:
        """Collective (--colocate): the current weights into every rank's engine, then rank 0 evaluates a held-out
        file with them (the result on rank 0, with ``on_sync``: whether they are exactly the newest published
        version; None elsewhere)."""
        self.colocated.load_weights()
        if self.rank != 0:
            return None
        return {**self.colocated.evaluate(path, params, self.state.version), "on_sync": self.weights.on_sync()}

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
        self.state.trained_since_version = True
        return counters

    def shutdown(self) -> None:
        """Close the weight sync, then leave the trainer group (TrainerRank.shutdown)."""
        if self.weights is not None:
            self.weights.close()
        super().shutdown()
