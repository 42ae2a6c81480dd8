"""The policy's loss in every algorithm: the registered policy loss the config names (coati/algorithm/policy_losses.py)
on the advantages an algorithm put in the batch, with the reference model's logprobs when the loss has a KL term,
and the policy's token entropy. The algorithm's ``PolicyObjective.loss`` is the loss function the policy's plugin
calls per micro-batch (the learner hands it over, learner.py); ``begin_epoch`` is called at the start of every ppo
epoch. The registered loss is looked up once, when the objective is built.

Proximal logprobs (the trainer's policy at the start of the step, for the decoupled off-policy correction and the
mismatch metrics) cost no extra forward pass: within the first ppo epoch no optimizer step has happened yet, so
the loss's own logprobs, detached, are exactly those; with several epochs they are kept per micro-batch (in call
order, which every epoch repeats) and reused by the later epochs.
"""

from __future__ import annotations

import torch

from coati.algorithm.batch import split_micro_batches
from coati.algorithm.loss import aggregate, masked_max
from coati.algorithm.policy_losses import LossInputs
from coati.algorithm.registry import get_policy_loss
from coati.layouts.base import layout_of
from coati.layouts.padded import windowed
from coati.plugins.base import causal_lm_logits
from coati.plugins.dist import to_device


def load_reference(config, policy_plugin):
    """The frozen initial policy of the KL term: with LoRA the policy itself with its adapters switched off
    (``AdaptersOffReference``: no second model), else a copy of the initial weights on the device and in the
    dtype the device rule gives it (``FrozenReference``)."""
    scoring = config.batch.train_microbatch_size, config.sampling.temperature
    if config.model.lora.enabled:
        return AdaptersOffReference(policy_plugin, *scoring)
    from coati.models.families import load_causal_lm

    placement = config.parallel.model_placement("reference")
    model = load_causal_lm(config.model.path, dtype=placement.dtype).to(placement.device)
    return FrozenReference(model.eval().requires_grad_(False), *scoring)


class FrozenReference:
    def __init__(self, model: torch.nn.Module, micro_batch_size: int, temperature: float):
        self.model, self.micro_batch_size, self.temperature = model, micro_batch_size, temperature

    @torch.no_grad()
    def logprobs(self, batch: dict) -> torch.Tensor:
        """[B, L-1] token logprobs of ``batch`` under the frozen initial weights."""
        chunks = []
        device = next(self.model.parameters()).device
        for micro in split_micro_batches(batch, self.micro_batch_size):
            micro = to_device(windowed(micro), device)
            logits = causal_lm_logits(self.model, micro)
            chunks.append(layout_of(micro).token_logprobs(logits, micro, self.temperature).cpu())
        return torch.cat(chunks)


class AdaptersOffReference:
    """The base model under the policy's LoRA adapters, through the policy's plugin (a collective forward, as
    training's: every rank computes its own share's)."""

    def __init__(self, plugin, micro_batch_size: int, temperature: float):
        self.plugin, self.micro_batch_size, self.temperature = plugin, micro_batch_size, temperature

    def logprobs(self, batch: dict) -> torch.Tensor:
        def on_cpu(logits, micro):
            return layout_of(micro).token_logprobs(logits, micro, self.temperature).cpu()

        with self.plugin.adapters_off():
            micro_batches = [windowed(micro) for micro in split_micro_batches(batch, self.micro_batch_size)]
            return torch.cat(self.plugin.forward_only(micro_batches, on_cpu))


def delivery_gap(inputs: LossInputs, fresh_rows: torch.Tensor) -> torch.Tensor:
    """The largest |behaviour - trainer| logprob over the valid tokens of ``fresh_rows`` (rows sampled by the
    weights the trainer holds, before any update): numeric noise when the engine got those weights, far more
    when it did not. -1 when no such token is here (the maximum over ranks then ignores this one)."""
    valid = (inputs.mask > 0) & fresh_rows.to(inputs.mask.device).unsqueeze(1)
    if not valid.any():
        return inputs.mask.new_full((), -1.0)
    return masked_max((inputs.prox - inputs.old_logprobs).abs().detach(), valid)


class PolicyObjective:
    def __init__(self, config, reference: FrozenReference | AdaptersOffReference | None = None):
        self.loss_config = config.algo.loss
        self.policy_loss = get_policy_loss(self.loss_config.objective)  # the whole registered loss (policy_losses.py)
        self.temperature = config.sampling.temperature
        self.keep_proximal = config.algo.ppo_epochs > 1
        self.reference = reference
        # The weights version the trainer's weights are exactly (set by the trainer each step; None when they
        # moved on since it was published): rows sampled by it must score as the trainer scores them.
        self.delivery_version: int | None = None
        self.begin_epoch(0)

    def begin_epoch(self, epoch: int) -> None:
        """A ppo epoch starts; a step's first one (``epoch`` 0) keeps its proximal logprobs afresh."""
        if epoch == 0:
            self._prox: list[torch.Tensor] = []  # first-epoch logprobs per micro-batch, for later ppo epochs
        self.epoch, self._prox_at = epoch, 0

    def _proximal(self, logprobs: torch.Tensor) -> torch.Tensor:
        """The policy's logprobs at the start of the step for this micro-batch (see the module docstring)."""
        if self.epoch == 0:
            prox = logprobs.detach()
            if self.keep_proximal:
                self._prox.append(prox)
            return prox
        prox = self._prox[self._prox_at]
        self._prox_at += 1
        return prox

    def loss(self, logits: torch.Tensor, micro_batch: dict) -> tuple[torch.Tensor, dict]:
        layout = layout_of(micro_batch)  # the micro-batch's layout reads the logits its forward gave
        logprobs = layout.token_logprobs(logits, micro_batch, self.temperature)
        normaliser = float(micro_batch["normaliser"][0])
        inputs = LossInputs(logprobs, micro_batch["old_logprobs"], micro_batch["advantages"],
                            micro_batch["action_mask"], normaliser, ref_logprobs=micro_batch.get("ref_logprobs"),
                            prox_logprobs=self._proximal(logprobs))
        loss, stats = self.policy_loss(inputs, self.loss_config)
        if self.epoch == 0 and self.delivery_version is not None:
            stats["delivery_gap"] = delivery_gap(inputs, micro_batch["policy_version"] == self.delivery_version)
        entropy = layout.token_entropy(logits, micro_batch, self.temperature)
        stats["entropy"] = aggregate(entropy, micro_batch["action_mask"], self.loss_config.loss_variation, normaliser)
        return loss, stats
