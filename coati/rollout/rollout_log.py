"""Rollout log records (``-rsd``): built by trainer rank 0 from the groups of a step, written by the driver.

One record per sample of every group drawn for a trained step, including the groups a filter (DAPO)
dropped, which carry ``kept: false`` and no advantage. For kept groups, ``shaped_reward``, ``advantage`` and
``in_loss`` are exactly what the loss used (the consumer's own advantages, after e.g. overlong shaping),
not the producer's provisional ones.
"""

from __future__ import annotations

import glob
import json
import os
from collections import Counter

import torch

from coati.rollout.group import RolloutGroup


def trained_prompt_counts(run_rollout_dir: str, steps=None) -> Counter:
    """How often each training prompt (its ``source``: file and line) was trained on, from the records in
    ``run_rollout_dir`` (``<rsd>/<project>``): one count per kept group, in ``steps`` only when given."""
    counts = Counter()
    for path in glob.glob(os.path.join(run_rollout_dir, "rollouts_step*.jsonl")):
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                record = json.loads(line)
                if record["sample"] == 0 and record["kept"] and (steps is None or record["step"] in steps):
                    counts[record["source"]] += 1
    return counts


def rollout_log_due(config, step: int) -> bool:
    """Whether trained step ``step`` is logged: every ``--rollout-save-interval`` steps when -rsd is set."""
    run = config.run
    return run.rollout_save_dir is not None and step % run.rollout_save_interval == 0


def rollout_records(step: int, drawn: list[RolloutGroup], kept: list[RolloutGroup], shaped: torch.Tensor,
                    advantages: torch.Tensor, in_loss: torch.Tensor) -> list[dict]:
    """``shaped``, ``advantages``, ``in_loss``: [len(kept), G] tensors for ``kept`` (a subset of ``drawn``,
    the same objects)."""
    row_of = {id(group): row for row, group in enumerate(kept)}
    records = []
    for index, group in enumerate(drawn):
        row = row_of.get(id(group))
        for sample, response in enumerate(group.responses):
            records.append({
                "step": step, "group": index, "sample": sample, "policy_version": group.policy_version,
                "source": group.source, "prompt": group.prompt_text,
                "response": group.texts[sample] if group.texts else None, "response_tokens": len(response),
                "finish_reason": group.finish_reasons[sample], "reward": group.rewards[sample],
                "correct": None if group.correct[sample] is None else bool(group.correct[sample]),
                "format_ok": bool(group.format_ok[sample]),
                **({"reason": group.reasons[sample]} if group.reasons else {}),
                "kept": row is not None,
                "shaped_reward": None if row is None else float(shaped[row, sample]),
                "advantage": None if row is None else float(advantages[row, sample]),
                "in_loss": row is not None and bool(in_loss[row, sample]),
                **({"reward_parts": group.reward_parts[sample]} if group.reward_parts else {}),
                **_episode_fields(group, sample),
            })
    return records


def _episode_fields(group: RolloutGroup, sample: int) -> dict:
    """A multi-turn episode's turns (what the model wrote, the environment's answer, tool call and outcome,
    weights version) and how many response tokens the model wrote; nothing for a single-turn group."""
    if not group.turns:
        return {}
    return {"turns": group.turns[sample], "model_tokens": sum(group.loss_mask(sample))}
