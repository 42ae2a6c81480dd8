"""Scoring generated responses with a trained reward model (a ``coati rm`` output), outside any training loop.

Used by ``coati evaluate`` and by the PPO producers, so it is plain torch + transformers: no Ray, no plugin.

How a response is scored, and why it matches training (coati/trainer/stage_tasks.py ``RewardTask``): a row is the prompt
ids, the response ids and one EOS, right-padded with the model's pad id and scored in one forward; the score is
``logits[:, 0]``, which transformers pools at the last token that is not the pad id. Training rows always end
in EOS, so the head has only learnt to read a hidden state at an EOS: a response is given its EOS when it does
not end in one, whatever its finish reason.

- Finished by EOS: the generated ids already end in it (``truncate_completion`` keeps the EOS); nothing added.
- Finished by a stop string (``</answer>``): no EOS was generated; one is appended, as for a natural end.
- Truncated at max_new_tokens: an EOS is appended too, so the model judges the text it was given instead of
  being read at a mid-sentence position it was never trained on (an out-of-distribution, arbitrary number).
  Whether a truncated response deserves less is a separate choice for the caller, from its finish reason
  (TRL's ``missing_eos_penalty``); OpenRLHF likewise closes every sequence with an EOS before the reward model.
"""

from __future__ import annotations

import json
import os

import torch


def read_model_config(path: str, what: str, hint: str) -> tuple[dict | None, str | None]:
    """(the config.json of the HF directory ``path``, None), or (None, one line saying why it cannot be read:
    "<what> directory not found or without config.json: <path> (<hint>)", or not a JSON object)."""
    config_path = os.path.join(path, "config.json")
    if not os.path.isfile(config_path):
        return None, f"{what} directory not found or without config.json: {path} ({hint})"
    try:
        with open(config_path, encoding="utf-8") as handle:
            config = json.load(handle)
    except (OSError, json.JSONDecodeError) as err:
        return None, f"{config_path}: not readable as JSON ({err})"
    if not isinstance(config, dict):
        return None, f"{config_path}: not a JSON object"
    return config, None


def reward_model_problem(path: str) -> str | None:
    """Why ``path`` is not a reward-model directory, from its config.json alone (None: it looks like one)."""
    config, problem = read_model_config(path, "reward model", "pass a `coati rm` output, e.g. runs/rm/final")
    if problem:
        return problem
    architectures = config.get("architectures") or []
    if not any(name.endswith("ForSequenceClassification") for name in architectures):
        return (f"{path} has no score head (architectures {architectures or 'unset'}, not *ForSequenceClassification): "
                "pass a reward model trained with `coati rm`, not a causal LM")
    labels = len(config.get("id2label") or {}) or config.get("num_labels") or 2  # transformers' default is 2
    if labels != 1:
        return f"{path}: the score head has {labels} labels; a reward model has one (num_labels=1)"
    if config.get("pad_token_id") is None:
        return f"{path}: config.json has no pad_token_id; the score is read at the last non-padding token, so set it"
    return None


def load_reward_model(path: str, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
    """The reward model at ``path`` in eval mode; ValueError (one line) when it is not one: no config, no
    single-label score head, no pad id, or a head missing from the weights (transformers would initialise it at
    random, and every score would be noise)."""
    from transformers import AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    problem = reward_model_problem(path)
    if problem:
        raise ValueError(problem)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its load report would say "MISSING" in a table; we say it in one line
    try:
        model, info = AutoModelForSequenceClassification.from_pretrained(path, dtype=dtype, output_loading_info=True)
    finally:
        hf_logging.set_verbosity(verbosity)
    if info["missing_keys"]:
        raise ValueError(f"{path}: weights missing from the checkpoint ({', '.join(sorted(info['missing_keys']))}): "
                         "they would be random; pass a reward model trained with `coati rm`")
    return model.to(device).eval()


def _special_ids(model, tokenizer_or_pad_id) -> tuple[int, int]:
    """(pad id, EOS id) as RewardTask used them: the tokenizer's pad (its EOS when it has none) and EOS; an int
    is the pad id and the EOS comes from the model's config."""
    if hasattr(tokenizer_or_pad_id, "eos_token_id"):
        eos_id = tokenizer_or_pad_id.eos_token_id
        pad_id = tokenizer_or_pad_id.pad_token_id if tokenizer_or_pad_id.pad_token_id is not None else eos_id
    else:  # an int, a numpy or 0-d tensor id
        pad_id, eos_id = int(tokenizer_or_pad_id), model.config.eos_token_id
    if not isinstance(eos_id, int):
        raise ValueError(f"no single EOS id (model config eos_token_id {eos_id!r}): "
                         "pass the tokenizer instead of a pad id")
    model_pad = model.config.get_text_config().pad_token_id
    if pad_id != model_pad:
        # transformers finds the scored position by the config's pad id: padding with another id would move it
        raise ValueError(f"pad id {pad_id} differs from the reward model's config pad_token_id {model_pad}")
    return pad_id, eos_id


@torch.no_grad()
def reward_model_scores(model, tokenizer_or_pad_id, prompt_ids_list: list[list[int]],
                        response_ids_list: list[list[int]], micro_batch_size: int = 16) -> list[float]:
    """The reward model's score of each (prompt, response) pair, in order.

    ``model``: an ``AutoModelForSequenceClassification`` with one label in eval mode (``load_reward_model``).
    ``tokenizer_or_pad_id``: the tokenizer the ids come from (pad and EOS ids; the reward model must share the
    policy's vocabulary), or the pad id as an int (the EOS is then ``model.config.eos_token_id``); the pad id
    must be the model's config ``pad_token_id``. ``prompt_ids_list[i]`` / ``response_ids_list[i]``: token ids as
    tokenised for generation (no padding) and as generated; an EOS is appended to a response that does not end
    in one (module docstring). ``micro_batch_size``: rows per forward; scores do not depend on it beyond float
    rounding. Inputs go to the model's device; scores come back as Python floats (float32 math).
    """
    if len(prompt_ids_list) != len(response_ids_list):
        raise ValueError(f"{len(prompt_ids_list)} prompts but {len(response_ids_list)} responses")
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be at least 1, got {micro_batch_size}")
    pad_id, eos_id = _special_ids(model, tokenizer_or_pad_id)
    rows = [list(prompt) + list(response) + ([] if response and response[-1] == eos_id else [eos_id])
            for prompt, response in zip(prompt_ids_list, response_ids_list)]
    device = next(model.parameters()).device
    scores: list[float] = []
    for start in range(0, len(rows), micro_batch_size):
        batch = rows[start : start + micro_batch_size]
        width = max(map(len, batch))
        input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
        for b, row in enumerate(batch):
            input_ids[b, : len(row)] = torch.tensor(row, dtype=torch.long)
            attention_mask[b, : len(row)] = 1
        logits = model(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device)).logits
        scores.extend(logits[:, 0].float().tolist())
    return scores


def reward_model_scorer(path: str | None, tokenizer, micro_batch_size: int = 16, placement=None):
    """``reward_model_scores`` bound to the reward model at ``path`` (loaded now) and ``tokenizer``: the callable
    (prompt ids list, response ids list) -> scores that rollouts and evaluations take; None without a path.
    ``placement``: the device rule's ``ModelPlacement`` for the reward model (default: this process's)."""
    if path is None:
        return None
    from functools import partial

    if placement is None:
        from coati.utils.device import model_placement

        placement = model_placement("reward_model")
    model = load_reward_model(path, placement.dtype, placement.device)
    return partial(reward_model_scores, model, tokenizer, micro_batch_size=micro_batch_size)
