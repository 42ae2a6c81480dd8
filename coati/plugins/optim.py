"""What every plugin builds around its model the same way: AdamW with weight decay on the right parameters,
the learning-rate schedule (a pure function of the step), and HF gradient checkpointing.

Weight decay follows transformers' Trainer: biases and every 1-D parameter (RMSNorm/LayerNorm weights) get
none; matrices (projections, embeddings, the LM head) decay by ``lr * weight_decay`` per step (AdamW's
decoupled decay).

Schedules (transformers' ``get_*_schedule_with_warmup``, the multiplier of the base learning rate at 0-based
step ``s`` of ``total`` steps with ``warmup`` warm-up steps):
- warm-up (all schedules): ``s / warmup`` for ``s < warmup`` (so the first step of a warm-up trains at 0);
- constant: 1 after the warm-up;
- linear: ``max(0, (total - s) / (total - warmup))``;
- cosine: ``max(0, 0.5 * (1 + cos(pi * (s - warmup) / (total - warmup))))``.
"""

from __future__ import annotations

import math

LR_SCHEDULES = ("constant", "linear", "cosine")


def lr_multiplier(step: int, total: int, warmup: int, schedule: str) -> float:
    """The factor of the base learning rate at 0-based step ``step`` (see the module's docstring)."""
    if schedule not in LR_SCHEDULES:
        raise ValueError(f"unknown learning-rate schedule {schedule!r}; choose one of {', '.join(LR_SCHEDULES)}")
    if step < warmup:
        return step / max(1, warmup)
    if schedule == "constant":
        return 1.0
    span = max(1, total - warmup)
    if schedule == "linear":
        return max(0.0, (total - step) / span)
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * (step - warmup) / span)))


def warmup_steps(total: int, steps: int, ratio: float) -> int:
    """Warm-up steps: ``steps`` when given (> 0), else ``ceil(ratio * total)`` (transformers' rule)."""
    return steps if steps > 0 else math.ceil(ratio * total)


def decays(name: str, param: torch.Tensor) -> bool:
    """Whether AdamW's weight decay applies to parameter ``name`` (not to biases and 1-D parameters)."""
    return not name.endswith("bias") and param.dim() >= 2


def make_adamw(model: torch.nn.Module, learning_rate: float, betas: tuple[float, float],
               weight_decay: float) -> torch.optim.AdamW:
    """AdamW over ``model``'s parameters, in two groups: with ``weight_decay`` and without (``decays``)."""
    named = [(name, param) for name, param in model.named_parameters() if param.requires_grad]
    groups = [{"params": [p for n, p in named if decays(n, p)], "weight_decay": weight_decay},
              {"params": [p for n, p in named if not decays(n, p)], "weight_decay": 0.0}]
    import torch  # here: config/ reads LR_SCHEDULES without importing torch

    return torch.optim.AdamW([g for g in groups if g["params"]], lr=learning_rate, betas=betas)


def set_learning_rate(optimizer, learning_rate: float) -> None:
    """Every parameter group of ``optimizer`` (or a wrapper exposing ``param_groups``) at ``learning_rate``."""
    for group in optimizer.param_groups:
        group["lr"] = learning_rate


def enable_gradient_checkpointing(model: torch.nn.Module) -> None:
    """HF activation checkpointing of every decoder layer (non-reentrant: works under DDP, FSDP2, TP and PP)."""
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise ValueError(f"{type(model).__name__} does not support gradient checkpointing; drop "
                         "--gradient-checkpointing")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False  # training forwards keep no KV cache (HF would warn and turn it off itself)
