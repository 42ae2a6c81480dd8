"""What differs between the supervised stages: the model class, how rows become tensors, the loss.

A task turns rows into tokenised items (identical on every rank), collates a list of items into one batch,
gives the step's loss normaliser, and is the ``loss_fn`` the trainer plugin calls with the logits of each
micro-batch (coati/plugins/base.py). The training step itself (learner.py, fed by supervised.py) is the same for
every task and every plugin layout.

- ``SFTTask``: causal LM; loss = mean negative log-likelihood of the completion tokens of the step (the
  prompt and the padding never count), the EOS token included, so the model learns to stop.
- ``RewardTask``: the LM body with a scalar head (``AutoModelForSequenceClassification``, ``num_labels=1``:
  transformers pools the head's output at the last non-padding token); each pair is two rows (prompt +
  chosen, prompt + rejected, each ending in EOS, as generated responses do) scored in one forward pass;
  loss = Bradley-Terry -log sigmoid(r_chosen - r_rejected) averaged over the step's pairs.
"""

from __future__ import annotations

import torch

from coati.algorithm.loss import bradley_terry_loss, completion_nll
from coati.dataset.jsonl import build_prompt
from coati.algorithm.batch import token_logprobs


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False).input_ids


def _pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, rows))
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for b, row in enumerate(rows):
        input_ids[b, : len(row)] = torch.tensor(row)
        attention_mask[b, : len(row)] = 1
    return input_ids, attention_mask


class SFTTask:
    name = "sft"
    rows_per_item = 1
    eval_keys = ("eval_loss",)
    trained_modules: tuple[str, ...] = ()  # trained in full beside LoRA adapters (--lora-rank)

    def __init__(self, tokenizer, system_prompt: str, max_length: int):
        self.tokenizer, self.system_prompt, self.max_length = tokenizer, system_prompt, max_length
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    @staticmethod
    def load_model(path: str):
        from coati.models.families import load_causal_lm

        return load_causal_lm(path, dtype=torch.float32)

    def tokenise(self, examples) -> tuple[list, int]:
        """([(prompt ids, completion ids + EOS)], number skipped as longer than max_length)."""
        items, skipped = [], 0
        for example in examples:
            prompt = _ids(self.tokenizer, build_prompt(self.tokenizer, example.messages, self.system_prompt))
            completion = _ids(self.tokenizer, example.completion) + [self.tokenizer.eos_token_id]
            if len(prompt) + len(completion) > self.max_length:
                skipped += 1
                continue
            items.append((prompt, completion))
        return items, skipped

    @staticmethod
    def weight(items) -> float:
        """The loss normaliser of a batch of items: its completion tokens."""
        return float(sum(len(completion) for _, completion in items))

    def collate(self, items) -> dict[str, torch.Tensor]:
        input_ids, attention_mask = _pad([p + c for p, c in items], self.pad_id)
        loss_mask = torch.zeros((len(items), input_ids.shape[1] - 1))  # aligned with logits[:, :-1]
        for b, (prompt, completion) in enumerate(items):
            loss_mask[b, len(prompt) - 1 : len(prompt) - 1 + len(completion)] = 1.0
        return {"input_ids": input_ids, "attention_mask": attention_mask, "loss_mask": loss_mask}

    def loss_fn(self, logits, micro_batch):
        logprobs = token_logprobs(logits, micro_batch["input_ids"])
        normaliser = float(micro_batch["normaliser"][0])
        loss = completion_nll(logprobs, micro_batch["loss_mask"], normaliser)
        return loss, {"loss": loss.detach()}

    @torch.no_grad()
    def evaluate(self, model, items, micro_batch_size: int) -> dict[str, float]:
        total = self.weight(items)
        loss = 0.0
        for start in range(0, len(items), micro_batch_size):
            batch = self.collate(items[start : start + micro_batch_size])
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            loss += float(completion_nll(token_logprobs(logits, batch["input_ids"]), batch["loss_mask"], total))
        return {"eval_loss": loss}


class RewardTask(SFTTask):
    name = "rm"
    rows_per_item = 2
    eval_keys = ("eval_loss", "eval_accuracy", "eval_chosen_reward", "eval_rejected_reward")
    trained_modules = ("score",)  # the fresh scalar head has no base to adapt

    @staticmethod
    def load_model(path: str):
        from transformers import AutoModelForSequenceClassification
        from transformers.utils import logging as hf_logging

        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # "score.weight newly initialized": expected, the head is what we train
        try:
            model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, dtype=torch.float32)
        finally:
            hf_logging.set_verbosity(verbosity)
        model.config.architectures = [type(model).__name__]  # what a saved copy is (save_hf reads it)
        if model.config.pad_token_id is None:  # pooling finds the last token by the pad id
            raise ValueError(f"{path}: the model config has no pad_token_id; the reward head pools at the last "
                             "non-padding token, so set pad_token_id in config.json")
        return model

    def tokenise(self, examples) -> tuple[list, int]:
        """([(prompt + chosen + EOS, prompt + rejected + EOS)], number skipped as longer than max_length)."""
        items, skipped = [], 0
        eos = [self.tokenizer.eos_token_id]
        for example in examples:
            prompt = _ids(self.tokenizer, build_prompt(self.tokenizer, example.messages, self.system_prompt))
            chosen = prompt + _ids(self.tokenizer, example.chosen) + eos
            rejected = prompt + _ids(self.tokenizer, example.rejected) + eos
            if max(len(chosen), len(rejected)) > self.max_length:
                skipped += 1
                continue
            items.append((chosen, rejected))
        return items, skipped

    @staticmethod
    def weight(items) -> float:
        return float(len(items))  # pairs

    def collate(self, items) -> dict[str, torch.Tensor]:
        input_ids, attention_mask = _pad([row for pair in items for row in pair], self.pad_id)  # c0, r0, c1, r1...
        return {"input_ids": input_ids, "attention_mask": attention_mask}

    def loss_fn(self, logits, micro_batch):
        scores = logits[:, 0].float()
        loss, stats = bradley_terry_loss(scores[0::2], scores[1::2], float(micro_batch["normaliser"][0]))
        return loss, stats

    @torch.no_grad()
    def evaluate(self, model, items, micro_batch_size: int) -> dict[str, float]:
        chosen, rejected = [], []
        for start in range(0, len(items), micro_batch_size):
            batch = self.collate(items[start : start + micro_batch_size])
            scores = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, 0].float()
            chosen.append(scores[0::2])
            rejected.append(scores[1::2])
        chosen, rejected = torch.cat(chosen), torch.cat(rejected)
        loss, stats = bradley_terry_loss(chosen, rejected, float(len(items)))
        return {"eval_loss": float(loss), "eval_accuracy": float(stats["accuracy"]),
                "eval_chosen_reward": float(chosen.mean()), "eval_rejected_reward": float(rejected.mean())}


TASKS = {"sft": SFTTask, "rm": RewardTask}
