"""One rank of a supervised stage (SFT or reward model), a thin shell like the RL trainer's consumer.py: it joins
the trainer group (rank.py), builds its one trained model (``TrainedModel`` of roles.py, on the plugin of the
layout -t/-tp/-pp/-zero/--plugin, exactly as the RL trainer's policy), tokenises the rows (identically on every
rank), and trains each step through the RL run's ``Learner.train_step`` (learner.py) fed by the supervised feed
with the task's loss (supervised.py, stage_tasks.py). Micro-batches are ``-tmbs`` items each, cut to their own
longest row.

Evaluation gathers the full weights onto rank 0 (collective, any layout) into a plain copy of the model and
scores the held-out rows there. Checkpoints hold the trained model's state as the RL trainer's do
(checkpointing.py). With ``--lora-rank`` the stage trains adapters on a frozen base (the reward model's head
in full); the saved model is the merged one, so the next stage and PPO load it as any model, and the adapter
itself is in its ``adapter/`` subdirectory. The driver's loop is coati/launcher/stage.py.
"""

from __future__ import annotations

import os
import time
from functools import partial

import torch

from coati.algorithm.batch import row_micro_batches
from coati.models.lora import merged_tensors
from coati.plugins.dist import all_reduce_stats
from coati.trainer.checkpointing import load_trained_models, save_trained_models
from coati.trainer.learner import Learner, LearnerSettings
from coati.trainer.rank import TrainerRank
from coati.trainer.roles import ACTOR, TrainedModel
from coati.trainer.stage_tasks import TASKS
from coati.trainer.step_algorithm import StepContext
from coati.trainer.supervised import SupervisedFeed, TaskAlgorithm, load_stage_rows
from coati.trainer.train_state import TrainState

ADAPTER_SUBDIR = "adapter"  # with --lora-rank: the trained adapter beside the merged model


class StageRank(TrainerRank):
    """One rank of a stage's trainer group (in-process, or a Ray actor: coati.cluster.trainer_group)."""

    def __init__(self, config, train_path: str, eval_path: str | None, model_path: str, rank: int = 0,
                 num_threads: int | None = None, actor: bool = False):
        super().__init__(rank, num_threads, actor, parts=config.parts)
        self.config, self.train_path, self.eval_path, self.model_path = config, train_path, eval_path, model_path
        self.state = TrainState()
        self.learner: Learner | None = None
        self.feed: SupervisedFeed | None = None
        self._eval_model = None

    def setup(self, master_address: str = "127.0.0.1", master_port: int = 29507) -> dict:
        """Join the group, build the trained model on its plugin, tokenise the rows, then the feed and the learner;
        the data's counts."""
        from transformers import AutoConfig, AutoTokenizer

        config = self.config
        torch.manual_seed(config.seed)  # the same on every rank: a fresh head starts identical
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.task = TASKS[config.stage](self.tokenizer, config.system_prompt, config.max_length)
        train, held_out = load_stage_rows(config, self.train_path, self.eval_path)
        self.train, skipped = self.task.tokenise(train)
        self.held_out, skipped_eval = self.task.tokenise(held_out)
        mesh = self.join_group(config, master_address, master_port)
        model_config = AutoConfig.from_pretrained(self.model_path)
        self.roles[ACTOR] = TrainedModel.build(ACTOR, config, self.task.load_model(self.model_path), config.lr, None,
                                               model_config, mesh=mesh, optim=config.optim, lora=config.lora,
                                               trained_modules=self.task.trained_modules)
        self.plugin = self.roles[ACTOR].plugin
        context = StepContext(config, self.rank, mesh.dp_size, mesh.dp_rank, self.task.pad_id, self.plugin,
                              lambda totals, summed=(), maxima=(): all_reduce_stats(totals, mesh, summed, maxima),
                              add_role=None)
        algorithm = TaskAlgorithm(context, self.task)
        self.roles[ACTOR].loss_fn = algorithm.objective.loss
        self.feed = SupervisedFeed(self.train, config.batch_size, config.seed, mesh.dp_size, mesh.dp_rank)
        self.learner = Learner(LearnerSettings(max_grad_norm=config.max_grad_norm, optim=config.optim), self.state,
                               self.roles, algorithm, context, partial(row_micro_batches, size=config.rows_per_micro_batch))
        steps = config.optim.schedule_horizon(self.feed.steps_per_epoch * config.epochs)
        self.learner.planned_steps = steps  # the learning-rate schedule's horizon
        return {"train_rows": len(self.train), "eval_rows": len(self.held_out), "skipped_too_long": skipped,
                "skipped_too_long_eval": skipped_eval, "steps": steps}

    def step(self, step: int) -> dict:
        """One optimizer step on this rank's share of step ``step``'s batch (the driver's count: a resumed run
        starts at its checkpoint's). Collective."""
        start = time.perf_counter()
        self.state.step = step
        metrics = self.learner.train_step(self.feed.work(step))
        return {**metrics, "step_time_s": time.perf_counter() - start}

    def evaluate(self) -> dict | None:
        """Held-out metrics on rank 0 (None elsewhere, and when there are no held-out rows). Collective."""
        tensors = self._model_tensors()  # every rank takes part in the gathers
        if not self.held_out or not self.plugin.is_weight_sender:
            return None
        if self._eval_model is None:
            self._eval_model = self.task.load_model(self.model_path).eval()
        unexpected = self._eval_model.load_state_dict(tensors, strict=False).unexpected_keys
        if unexpected:
            raise RuntimeError(f"gathered weights the model does not have: {unexpected[:3]}")
        return self.task.evaluate(self._eval_model, self.held_out, self.config.micro_batch_size)

    def _model_tensors(self) -> dict[str, torch.Tensor]:
        """Collective: the trained model's full tensors by HF name on the sender; with LoRA the adapters merged into
        the base, so the evaluation copy and the saved model are plain HF models."""
        if not self.config.lora.enabled:
            return dict(self.plugin.named_full_tensors())
        return dict(merged_tensors(self.plugin.named_full_tensors(include_frozen=True), self.config.lora))

    def save_pretrained(self, path: str) -> str:
        """Collective: the model as an HF directory with the tokenizer (written by the sender). With LoRA it is the
        merged model (the next stage and PPO load it as any model), and its adapter is kept in ``adapter/``."""
        if not self.config.lora.enabled:
            return super().save_pretrained(path)
        from coati.plugins.torch_native import save_hf

        tensors = self._model_tensors()
        if self.plugin.is_weight_sender:
            save_hf(self.plugin.module, tensors, path)
        self.plugin.save_pretrained(os.path.join(path, ADAPTER_SUBDIR))
        if self.plugin.is_weight_sender:
            self.tokenizer.save_pretrained(path)
        return path

    def save_checkpoint(self, staging: str) -> None:
        """Collective: this rank's part of a stage checkpoint, the trained model's state (checkpointing.py)."""
        save_trained_models(self.roles.values(), staging)

    def load_checkpoint(self, path: str) -> None:
        """Collective, after setup: the trained model's state from a stage checkpoint, in any layout the plugin
        reads."""
        load_trained_models(self.roles.values(), path)
