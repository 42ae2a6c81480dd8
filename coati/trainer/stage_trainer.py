"""One rank of a supervised stage (SFT or reward model): the same step for every task and layout.

``StageTrainer`` joins the trainer group, builds its one trained model (``TrainedModel`` of roles.py, on the
plugin of the layout -t/-tp/-pp/-zero/--plugin, exactly as the RL trainer's policy), tokenises the rows
(identically on every rank) and trains its data-parallel share of each step's batch with the task's loss
(stage_tasks.py). Each step takes ``batch_size`` rows of a per-epoch permutation (seeded); data-parallel rank
k trains the k-th contiguous slice, and every rank divides by the step's global normaliser / dp (completion
tokens for SFT, pairs for the reward model), so the averaged gradients are those of the whole batch in one
process.

Evaluation gathers the full weights onto rank 0 (collective, any layout) into a plain copy of the model and
scores the held-out rows there. Checkpoints hold the trained model's state as the RL trainer's do
(checkpointing.py). With ``--lora-rank`` the stage trains adapters on a frozen base (the reward model's head
in full); the saved model is the merged one, so the next stage and PPO load it as any model, and the adapter
itself is in its ``adapter/`` subdirectory. The driver's loop is coati/launcher/stage.py.
"""

from __future__ import annotations

import os
import random
import time

import torch

from coati.cluster.trainer_group import rendezvous_address
from coati.config.errors import ConfigError
from coati.models.lora import merged_tensors
from coati.plugins.dist import all_reduce_stats
from coati.registry import resolve
from coati.trainer.checkpointing import load_trained_models, save_trained_models
from coati.trainer.roles import ACTOR, TrainedModel
from coati.trainer.stage_tasks import TASKS

ADAPTER_SUBDIR = "adapter"  # with --lora-rank: the trained adapter beside the merged model


def load_stage_rows(config, train_path: str, eval_path: str | None):
    """(train examples, held-out examples) of the stage's row format, split by --eval-fraction when no -ed."""
    from coati.dataset.loader import DatasetError
    from coati.dataset.rlhf_rows import load_preferences, load_sft

    load = load_sft if config.stage == "sft" else load_preferences
    try:
        train = load(train_path)
        held_out = load(eval_path) if eval_path else []
    except DatasetError as err:
        raise ConfigError(str(err)) from None
    if not eval_path and config.eval_fraction > 0:
        order = list(range(len(train)))
        random.Random(config.seed).shuffle(order)
        count = max(1, int(len(train) * config.eval_fraction))
        held = set(order[:count])
        held_out = [train[i] for i in sorted(held)]
        train = [example for i, example in enumerate(train) if i not in held]
    return train, held_out


class StageTrainer:
    """One rank of a stage's trainer group (in-process, or a Ray actor: coati.cluster.trainer_group)."""

    def __init__(self, config, train_path: str, eval_path: str | None, model_path: str, rank: int = 0,
                 num_threads: int | None = None, actor: bool = False):
        if actor:
            from coati.utils.actor_process import start_actor_process

            start_actor_process()
        self.config, self.rank = config, rank
        self.train_path, self.eval_path, self.model_path = train_path, eval_path, model_path
        if num_threads:  # Ray actors get a share of the cores; in-process the caller's setting stands
            torch.set_num_threads(num_threads)
        self.trained: TrainedModel | None = None
        self.mesh = None
        self._eval_model = None
        self._order = (None, None)  # (epoch, its permutation of the training rows)

    @property
    def plugin(self):
        """The trained model's plugin (its layout, its sending rank)."""
        return self.trained.plugin

    def rendezvous_address(self) -> tuple[str, int]:
        return rendezvous_address()

    def setup(self, master_address: str = "127.0.0.1", master_port: int = 29507) -> dict:
        """Join the group, build the trained model on its plugin, tokenise the rows; the data's counts."""
        from transformers import AutoConfig, AutoTokenizer

        from coati.plugins import TrainerMesh

        config = self.config
        torch.manual_seed(config.seed)  # the same on every rank: a fresh head starts identical
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.task = TASKS[config.stage](self.tokenizer, config.system_prompt, config.max_length)
        train, held_out = load_stage_rows(config, self.train_path, self.eval_path)
        self.train, skipped = self.task.tokenise(train)
        self.held_out, skipped_eval = self.task.tokenise(held_out)
        spec = config.plugin_spec
        if spec.distributed:
            from coati.plugins.dist import init_trainer_group

            init_trainer_group(self.rank, config.num_trainers, master_address, master_port)
            if spec.launch is not None:
                resolve(spec.launch)()
        self.mesh = TrainerMesh.build(config.parallel_dims)
        model_config = AutoConfig.from_pretrained(self.model_path)
        self.trained = TrainedModel.build(ACTOR, config, self.task.load_model(self.model_path), config.lr,
                                          self.task.loss_fn, model_config, mesh=self.mesh, lora=config.lora,
                                          trained_modules=self.task.trained_modules)
        return {"train_rows": len(self.train), "eval_rows": len(self.held_out), "skipped_too_long": skipped,
                "skipped_too_long_eval": skipped_eval, "steps": self.total_steps}

    @property
    def steps_per_epoch(self) -> int:
        return len(self.train) // self.config.batch_size

    @property
    def total_steps(self) -> int:
        return self.steps_per_epoch * self.config.epochs

    def batch_items(self, step: int) -> list:
        """The rows of global step ``step`` (0-based): a slice of its epoch's seeded permutation."""
        epoch, index = divmod(step, self.steps_per_epoch)
        if self._order[0] != epoch:  # one permutation per epoch, drawn once
            generator = torch.Generator().manual_seed(self.config.seed + epoch)
            self._order = (epoch, torch.randperm(len(self.train), generator=generator))
        order = self._order[1]
        size = self.config.batch_size
        return [self.train[i] for i in order[index * size : (index + 1) * size].tolist()]

    def step(self, step: int) -> dict:
        """One optimizer step on this rank's share of step ``step``'s batch. Collective."""
        config, mesh = self.config, self.mesh
        start = time.perf_counter()
        items = self.batch_items(step)
        share = len(items) // mesh.dp_size
        mine = items[mesh.dp_rank * share : (mesh.dp_rank + 1) * share]
        normaliser = self.task.weight(items) / mesh.dp_size
        micro_batches = []
        for first in range(0, len(mine), config.micro_batch_size):
            batch = self.task.collate(mine[first : first + config.micro_batch_size])
            batch["normaliser"] = torch.full((batch["input_ids"].shape[0],), normaliser)
            micro_batches.append(batch)
        stats = self.trained.plugin.forward_backward(micro_batches, self.trained.loss_fn)
        grad_norm = self.trained.plugin.optimizer_step(config.max_grad_norm)
        totals = {name: sum(float(s[name]) for s in stats) for name in stats[0]}
        # each rank's statistics are its share of the global value times dp (normaliser global / dp)
        return {**all_reduce_stats(totals, mesh), "grad_norm": grad_norm, "step_time_s": time.perf_counter() - start}

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
        if self.config.lora.enabled:
            from coati.plugins.torch_native import save_hf

            tensors = self._model_tensors()
            if self.plugin.is_weight_sender:
                save_hf(self.plugin.module, tensors, path)
            self.plugin.save_pretrained(os.path.join(path, ADAPTER_SUBDIR))
        else:
            self.plugin.save_pretrained(path)
        if self.plugin.is_weight_sender:
            self.tokenizer.save_pretrained(path)
        return path

    def save_checkpoint(self, staging: str) -> None:
        """Collective: this rank's part of a stage checkpoint, the trained model's state (checkpointing.py)."""
        save_trained_models([self.trained], staging)

    def load_checkpoint(self, path: str) -> None:
        """Collective, after setup: the trained model's state from a stage checkpoint, in any layout the plugin
        reads."""
        load_trained_models([self.trained], path)

    def full_state(self) -> dict[str, torch.Tensor]:
        return {name: tensor.clone() for name, tensor in self.plugin.named_full_tensors()}

    def shutdown(self) -> None:
        if self.trained is not None:
            self.trained.close()
        if self.mesh is not None:
            self.mesh.close()
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
