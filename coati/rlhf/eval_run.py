"""The work of ``coati evaluate`` (options and checks: coati/rlhf/evaluate.py): tokenise the prompts as the
producers do, generate one completion per prompt and mode, score, write the summary and samples, tabulate."""

from __future__ import annotations

import contextlib
import json
import os
import statistics
from dataclasses import dataclass

import torch

from coati.dataset.rlhf_rows import has_answer
from coati.distributed.config import ConfigError
from coati.distributed.evaluation import score_outputs
from coati.distributed.generation import tokenise_prompts
from coati.distributed.inference_backend import SamplingParams, TransformersBackend
from coati.rlhf.evaluate import DEFAULT_MAX_NEW_TOKENS, MODES, EvalConfig, Inputs, samples_path
from coati.rlhf.reward_model import load_reward_model, reward_model_scores
from rewards import STOP_STRINGS, default_system_prompt
from rewards.scorer import RewardScorer

VERIFIABLE = ("gt_answer", "extracted", "reward", "correct", "format_ok", "reason")


@dataclass
class Plan:
    config: EvalConfig
    inputs: Inputs
    tokenizer: object
    system_prompt: str
    batch: list  # (example, prompt text, prompt ids), as coati.distributed.generation.tokenise_prompts gives
    skipped: int  # prompts longer than -mpt
    max_new_tokens: int


def _system_prompt(config: EvalConfig, tokenizer) -> str:
    if config.system_prompt is not None:
        return config.system_prompt
    # a model with a chat template is a user's model, trained by `coati train -m` with the type's prompt; the
    # embedded tiny models have no template and were trained on bare prompts
    return default_system_prompt(config.reward_type) if getattr(tokenizer, "chat_template", None) else ""


def _max_new_tokens(config: EvalConfig, model_dir: str, longest_prompt: int) -> int:
    if config.max_new_tokens is not None:
        return config.max_new_tokens
    wanted = DEFAULT_MAX_NEW_TOKENS["demo" if config.model is None else "model"]
    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as handle:
        positions = json.load(handle).get("max_position_embeddings")
    if positions:  # the demo model has 1024 positions: 1024 new tokens after a prompt would run past them
        wanted = min(wanted, positions - longest_prompt)
    _require(wanted >= 1, f"the longest prompt ({longest_prompt} tokens) fills the model's {positions} positions: "
                          "lower -mpt")
    return wanted


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def prepare(config: EvalConfig, inputs: Inputs, tokenizer) -> Plan:
    """Tokenised prompts and the generation length; still no model loaded."""
    system_prompt = _system_prompt(config, tokenizer)
    batch, skipped = tokenise_prompts(tokenizer, inputs.examples, system_prompt, config.max_prompt_tokens)
    _require(bool(batch), f"{inputs.dataset}: all {len(inputs.examples)} prompts are longer than -mpt "
                          f"{config.max_prompt_tokens} tokens")
    longest = max(len(ids) for _, _, ids in batch)
    return Plan(config, inputs, tokenizer, system_prompt, batch, skipped,
                _max_new_tokens(config, inputs.model, longest))


def evaluate_mode(backend, scorer, reward_model, plan: Plan, mode: str) -> tuple[dict, list[dict]]:
    """(metrics, one record per prompt) of one decoding mode."""
    config = plan.config
    params = SamplingParams(temperature=MODES[mode], max_new_tokens=plan.max_new_tokens,
                            stop_strings=STOP_STRINGS[config.reward_type],
                            seed=config.seed if MODES[mode] > 0 else None)
    prompt_ids = [ids for _, _, ids in plan.batch]
    outputs = backend.generate(prompt_ids, params)
    completions = [choices[0] for choices in outputs]
    records = [{"mode": mode, "source": example.source, "prompt": text, "response": completion.text,
                "finish_reason": completion.finish_reason, "response_tokens": len(completion.token_ids),
                **dict.fromkeys(VERIFIABLE), "rm_score": None}
               for (example, text, _), completion in zip(plan.batch, completions)]
    answered = [i for i, (example, _, _) in enumerate(plan.batch) if has_answer(example)]
    metrics = {"prompts": len(records), "answered": len(answered), "accuracy": None, "format_rate": None,
               "mean_reward": None, "rm_score_mean": None, "rm_score_std": None}
    if answered:
        result = score_outputs([outputs[i] for i in answered], [plan.batch[i][0] for i in answered], scorer)
        for i, scored in zip(answered, result.records):
            records[i].update({key: scored.get(key) for key in VERIFIABLE})
        metrics.update(accuracy=result.accuracy, format_rate=result.format_rate, mean_reward=result.mean_reward)
    if reward_model is not None:
        scores = reward_model_scores(reward_model, plan.tokenizer, prompt_ids, [c.token_ids for c in completions],
                                     config.micro_batch_size)
        for record, score in zip(records, scores):
            record["rm_score"] = score
        metrics.update(rm_score_mean=statistics.fmean(scores), rm_score_std=statistics.pstdev(scores))
    metrics["truncated"] = sum(c.finish_reason == "length" for c in completions) / len(completions)
    metrics["response_tokens"] = statistics.fmean(len(c.token_ids) for c in completions)
    return metrics, records


@contextlib.contextmanager
def _no_load_bars():
    """Two "Loading weights" bars per run say nothing the table does not; restored after (in-process callers)."""
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if shown:
            hf_logging.enable_progress_bar()


def run(plan: Plan) -> dict:
    """Load the reward model (first: a bad one fails before the policy is loaded) and the policy, evaluate every
    mode, write the summary and the samples; the summary."""
    from transformers import AutoModelForCausalLM

    config, inputs = plan.config, plan.inputs
    reward_model = None
    with _no_load_bars():
        if config.reward_model:
            try:
                reward_model = load_reward_model(config.reward_model)
            except ValueError as err:
                raise ConfigError(str(err)) from None
        policy = AutoModelForCausalLM.from_pretrained(inputs.model, dtype=torch.float32)
    backend = TransformersBackend(policy, plan.tokenizer, config.micro_batch_size)
    scorer = RewardScorer(config.reward_type) if any(has_answer(e) for e, _, _ in plan.batch) else None
    modes, records = {}, []
    for mode in config.mode_names:
        modes[mode], mode_records = evaluate_mode(backend, scorer, reward_model, plan, mode)
        records.extend(mode_records)
    summary = {"model": inputs.model, "dataset": inputs.dataset, "reward_model": config.reward_model,
               "reward_type": config.reward_type, "system_prompt": plan.system_prompt,
               "max_new_tokens": plan.max_new_tokens, "prompts": len(plan.batch), "skipped_too_long": plan.skipped,
               "seed": config.seed, "modes": modes, "output": inputs.output, "samples": samples_path(inputs.output)}
    os.makedirs(os.path.dirname(os.path.abspath(inputs.output)), exist_ok=True)
    with open(inputs.output, "w", encoding="utf-8") as handle:
        json.dump(summary, handle, indent=1)
    with open(summary["samples"], "w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record) + "\n")
    return summary


def format_table(summary: dict) -> str:
    """The summary as a few lines: one row per mode, columns only for what was measured."""
    first = next(iter(summary["modes"].values()))
    answered, scored = first["answered"], first["rm_score_mean"] is not None
    columns = [("prompts", "prompts", "d")]
    if answered:
        columns += [("accuracy", "accuracy", ".4f"), ("format", "format_rate", ".4f"), ("reward", "mean_reward", ".4f")]
    if scored:
        columns += [("rm_score", "rm_score_mean", ".4f"), ("rm_std", "rm_score_std", ".4f")]
    columns += [("truncated", "truncated", ".4f"), ("tokens", "response_tokens", ".1f")]
    skipped = f", {summary['skipped_too_long']} skipped as too long" if summary["skipped_too_long"] else ""
    lines = [f"{summary['model']} on {summary['dataset']}: {summary['prompts']} prompts{skipped}, "
             f"{summary['max_new_tokens']} new tokens at most",
             f"{'mode':<8}" + "".join(f"{title:>10}" for title, _, _ in columns)]
    for mode, metrics in summary["modes"].items():
        lines.append(f"{mode:<8}" + "".join(f"{metrics[key]:>10{fmt}}" for _, key, fmt in columns))
    if not answered:
        lines.append(f"no answers in the rows: accuracy, format and reward (-rt {summary['reward_type']}) skipped "
                     "(rows need gt_answer, or --label-key naming the answer field)")
    elif answered < summary["prompts"]:
        lines.append(f"accuracy, format and reward over the {answered} of {summary['prompts']} prompts with answers")
    if not scored:
        lines.append("no --reward-model: reward-model scores skipped")
    lines += [f"summary: {summary['output']}", f"samples: {summary['samples']}"]
    return "\n".join(lines)
