"""GRPO: clipped importance-ratio loss on group-normalised advantages, optional k3 KL to a frozen reference."""

from __future__ import annotations

import torch

from coati.distributed.consumer import Consumer
from coati.distributed.loss import batch_normaliser, policy_loss
from coati.distributed.rollout import split_micro_batches, token_logprobs


class GRPOConsumer(Consumer):
    def setup_algorithm(self) -> None:
        self.loss_config = self.config.algo.loss
        self.temperature = self.config.sampling.temperature
        self.reference = None
        if self.loss_config.kl_coeff > 0:
            from transformers import AutoModelForCausalLM

            self.reference = AutoModelForCausalLM.from_pretrained(self.config.model.path, dtype=torch.float32).eval()
            self.reference.requires_grad_(False)

    @torch.no_grad()
    def _reference_logprobs(self, batch: dict) -> torch.Tensor:
        chunks = []
        for micro in split_micro_batches(batch, self.config.batch.train_microbatch_size):
            logits = self.reference(input_ids=micro["input_ids"], attention_mask=micro["attention_mask"]).logits
            chunks.append(token_logprobs(logits, micro["input_ids"], self.temperature))
        return torch.cat(chunks)

    def prepare(self, batch, num_minibatches):
        # The loss of a step is the mean over its minibatches, so each minibatch's normaliser is scaled.
        normaliser = batch_normaliser(batch["action_mask"], self.loss_config.loss_variation) * num_minibatches
        batch["normaliser"] = torch.full((batch["input_ids"].shape[0],), normaliser)
        if self.reference is not None:
            batch["ref_logprobs"] = self._reference_logprobs(batch)
        return batch

    def loss_fn(self, logits, micro_batch):
        logprobs = token_logprobs(logits, micro_batch["input_ids"], self.temperature)
        return policy_loss(logprobs, micro_batch["old_logprobs"], micro_batch["advantages"],
                           micro_batch["action_mask"], self.loss_config, float(micro_batch["normaliser"][0]),
                           micro_batch.get("ref_logprobs"))
