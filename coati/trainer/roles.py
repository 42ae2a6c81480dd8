"""The models a trainer group trains, each on every rank through a plugin of its own: the policy (``actor``)
and, for PPO, the ``critic``.

The trainer group (consumer.py, with its rollout feed, learner and weight publisher) owns what is shared: drawing
groups, data-parallel shares, publishing weights,
checkpoints. A ``TrainedModel`` owns one model's plugin, the loss function that plugin is handed, its learning-rate
schedule and its state, so adding a model to the group (a critic beside the policy, as verl's workers separate them) is one more role, not another
trainer. Every role uses the group's layout (-t/-zero/--plugin) on the group's one TrainerMesh (one set of
sub-groups; coati.plugins.mesh), and
checkpoints its state under ``trainer_state/<role>/``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from coati.config.lora import LoraConfig
from coati.config.optim import OptimConfig
from coati.layouts.rule import check_model
from coati.models.lora import add_adapters
from coati.plugins import make_plugin
from coati.plugins.base import LossFn, TrainerPlugin
from coati.plugins.optim import lr_multiplier, warmup_steps
from coati.plugins.mesh import TrainerMesh
from coati.plugins.state import MANIFEST

ACTOR = "actor"


@dataclass
class TrainedModel:
    name: str
    plugin: TrainerPlugin
    loss_fn: LossFn | None  # what the plugin's forward_backward calls per micro-batch
    learning_rate: float = 0.0  # the base rate the schedule scales
    optim: OptimConfig = OptimConfig()
    # the micro-batch layouts its model was checked for (coati/layouts/rule.py: layouts_to_check) -> passed
    layout_checks: dict | None = None
    attention: str | None = None  # the model's attention implementation (how wide a packed row may be)
    parameters: int = 0  # the model's parameters (what a forward pass costs: coati/layouts/registry.py)

    @classmethod
    def build(cls, name: str, parallel, model: torch.nn.Module, learning_rate: float, loss_fn: LossFn | None,
              model_config=None, mesh: TrainerMesh | None = None, optim: OptimConfig = OptimConfig(),
              lora: LoraConfig = LoraConfig(), trained_modules: tuple[str, ...] = (),
              check_layouts: tuple[str, ...] = ()) -> "TrainedModel":
        """Lay ``model`` out as the group's ``parallel`` config says, on the group's ``mesh`` (collective: every
        rank builds it), with ``optim``'s weight decay and gradient checkpointing; with ``lora`` enabled only
        its adapters (and ``trained_modules``, e.g. a critic's fresh head) train. ``check_layouts`` names the
        micro-batch layouts to check the model for first, on the whole model (``Layout.exact``)."""
        parameters = sum(p.numel() for p in model.parameters())  # before adapters, as the rule counted them
        if lora.enabled:
            model = add_adapters(model, lora, trained_modules)
        checks = check_model(model, check_layouts)
        attention = attention_of(model)
        plugin = make_plugin(parallel.plugin_name, parallel.tensor_parallel_size, parallel.pipeline_parallel_size,
                             parallel.zero_stage, parallel.precision, world_size=parallel.num_trainers,
                             model_config=model_config if model_config is not None else getattr(model, "config", None),
                             mesh=mesh)
        plugin.setup(model, learning_rate, weight_decay=optim.weight_decay,
                     gradient_checkpointing=optim.gradient_checkpointing)
        return cls(name, plugin, loss_fn, learning_rate, optim, checks, attention, parameters)

    def schedule_learning_rate(self, step: int, total_steps: int) -> float:
        """Set the learning rate of the run's 0-based step ``step`` of ``total_steps`` (the schedule is a pure
        function of the step, so a resumed run, whose step counter the checkpoint holds, continues it exactly)."""
        warmup = warmup_steps(total_steps, self.optim.lr_warmup_steps, self.optim.lr_warmup_ratio)
        rate = self.learning_rate * lr_multiplier(step, total_steps, warmup, self.optim.lr_scheduler)
        self.plugin.set_learning_rate(rate)
        return rate

    def state_dir(self, trainer_state: str) -> str:
        return os.path.join(trainer_state, self.name)

    def save_state(self, trainer_state: str) -> None:
        self.plugin.save_state(self.state_dir(trainer_state))

    def load_state(self, trainer_state: str) -> None:
        self.plugin.load_state(role_state_dir(trainer_state, self.name))

    def close(self) -> None:
        self.plugin.close()


def attention_of(model: torch.nn.Module) -> str | None:
    """The model's attention implementation (transformers' config names it), or None."""
    return getattr(getattr(model, "config", None), "_attn_implementation", None)


def role_state_dir(trainer_state: str, name: str) -> str:
    """Where role ``name``'s state lies in a checkpoint's ``trainer_state``; checkpoints written before the
    roles existed hold the policy's state directly there."""
    path = os.path.join(trainer_state, name)
    if name == ACTOR and not os.path.isdir(path) and os.path.isfile(os.path.join(trainer_state, MANIFEST)):
        return trainer_state
    return path


def grad_norm_name(role: str) -> str:
    """Metric name of a role's gradient norm: ``grad_norm`` for the policy (as before roles), else prefixed."""
    return "grad_norm" if role == ACTOR else f"{role}_grad_norm"

