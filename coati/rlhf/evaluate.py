"""``coati evaluate``: one checkpoint on a file of prompts, one completion per prompt, greedy and/or sampled.

Any HF causal-LM directory is a checkpoint: ``coati sft``'s ``<run>/final``, a GRPO/PPO ``<run>/step_N``, a
downloaded model. Reported per decoding mode:
- with answers in the rows (``label``, the older ``gt_answer``, or the field ``--label-key`` names; PRIME test cases
  for ``-rt code``):
  accuracy, format rate and mean reward of the training reward (``-rt`` with ``--reward-fn``, ``--reward-weights``,
  ``--reward-url``, ``--correct-threshold``, as ``coati train`` takes them; on a run's ``step_N`` checkpoint the
  run's own unless given here, which one line says first), over the rows that have one;
- with ``--reward-model DIR`` (a ``coati rm`` output): the mean and (population) standard deviation of its
  scores of the responses, every row included (coati/rollout/reward_model.py says how a response is scored).

Outputs: a table on stdout, a JSON summary (``-o``; default ``<parent of the checkpoint>/evals/<checkpoint
name>_<eval file name>.json``, so the evals of a run's checkpoints sit together and no checkpoint directory is
written into) and beside it ``<same name>.samples.jsonl``, one record per prompt and mode. Every bad option, path
or row is one ``error:`` line (exit 2) before any model is loaded.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
from dataclasses import dataclass

from coati.config.errors import ConfigError, require
from coati.config.sampling import SamplingParams
from coati.dataset.rlhf_rows import has_answer
from coati.rlhf.eval_config import (
    DEFAULT_MAX_NEW_TOKENS,
    DESCRIPTION,
    MODES,
    EvalConfig,
    Inputs,
    check_inputs,
    reward_line,
    run_reward_defaults,
    samples_path,
    tokenizers,
)
from coati.rollout.evaluation import score_outputs
from coati.rollout.generation import tokenise_prompts
from coati.rollout.inference_backend import TransformersBackend
from coati.rollout.reward_model import load_reward_model, reward_model_scores
from coati.utils.dataclass_cli import ConfigFileError, build_parser, construct
from rewards import default_system_prompt
from rewards.scorer import RewardScorer

VERIFIABLE = ("gt_answer", "extracted", "reward", "correct", "format_ok", "reason")


@dataclass
class Plan:
    config: EvalConfig
    inputs: Inputs
    tokenizer: object
    system_prompt: str
    batch: list  # (example, prompt text, prompt ids), as coati.rollout.generation.tokenise_prompts gives
    skipped: int  # prompts longer than -mpt
    max_new_tokens: int


def _system_prompt(config: EvalConfig, tokenizer) -> str:
    if config.system_prompt is not None:
        return config.system_prompt
    if config.prompt_template is not None:  # a base model's template carries its own instructions, as in training
        return ""
    # a model with a chat template is a user's model, trained by `coati train -m` with the type's prompt; the
    # embedded tiny models have no template and were trained on bare prompts
    return default_system_prompt(config.reward_type) if getattr(tokenizer, "chat_template", None) else ""


def _max_new_tokens(config: EvalConfig, model_dir: str, longest_prompt: int) -> int:
    if config.max_new_tokens is not None:
        return config.max_new_tokens
    wanted = DEFAULT_MAX_NEW_TOKENS["demo" if config.model is None else "model"]
    from coati.models.lora import config_dir

    with open(os.path.join(config_dir(model_dir), "config.json"), encoding="utf-8") as handle:
        positions = json.load(handle).get("max_position_embeddings")
    if positions:  # the demo model has 1024 positions: 1024 new tokens after a prompt would run past them
        wanted = min(wanted, positions - longest_prompt)
    require(wanted >= 1, f"the longest prompt ({longest_prompt} tokens) fills the model's {positions} positions: "
                          "lower -mpt")
    return wanted



def prepare(config: EvalConfig, inputs: Inputs, tokenizer) -> Plan:
    """Tokenised prompts and the generation length; still no model loaded."""
    system_prompt = _system_prompt(config, tokenizer)
    batch, skipped = tokenise_prompts(tokenizer, inputs.examples, system_prompt, config.max_prompt_tokens,
                                      config.prompt_template)
    require(bool(batch), f"{inputs.dataset}: all {len(inputs.examples)} prompts are longer than -mpt "
                          f"{config.max_prompt_tokens} tokens")
    longest = max(len(ids) for _, _, ids in batch)
    return Plan(config, inputs, tokenizer, system_prompt, batch, skipped,
                _max_new_tokens(config, inputs.model, longest))


def evaluate_mode(backend, scorer, reward_model, plan: Plan, mode: str) -> tuple[dict, list[dict]]:
    """(metrics, one record per prompt) of one decoding mode."""
    config = plan.config
    params = SamplingParams(temperature=MODES[mode], max_new_tokens=plan.max_new_tokens,
                            stop_strings=config.stop_strings(config.reward_type),
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


def _scorer(config: EvalConfig) -> RewardScorer:
    """The run's reward: -rt with the user's functions, server and weights; one ConfigError line when one of
    them cannot load."""
    from rewards.combine import RewardWeightsError
    from rewards.remote import RemoteRewardError
    from rewards.user import RewardFnError

    try:
        return RewardScorer(config.reward_type, **config.reward_options())
    except (RewardFnError, RemoteRewardError, RewardWeightsError) as err:
        raise ConfigError(str(err)) from None


def run(plan: Plan, reward: str | None = None) -> dict:
    """Load the reward model (first: a bad one fails before the policy is loaded) and the policy, evaluate every
    mode, write the summary and the samples; the summary. ``reward``: the line naming the reward (default: the
    options')."""
    from coati.models.families import load_causal_lm
    from coati.models.lora import is_adapter_dir, load_adapted
    from coati.utils.device import model_placement

    config, inputs = plan.config, plan.inputs
    reward_model = None
    with _no_load_bars():
        if config.reward_model:
            rm_placement = model_placement("reward_model", dtype=config.model_dtype)
            try:
                reward_model = load_reward_model(config.reward_model, rm_placement.dtype, rm_placement.device)
            except ValueError as err:
                raise ConfigError(str(err)) from None
        placement = model_placement("evaluate", dtype=config.model_dtype)
        if is_adapter_dir(inputs.model):  # a LoRA checkpoint: its base with the adapter merged in
            policy = load_adapted(inputs.model, placement.dtype).merge_and_unload().to(placement.device)
        else:
            policy = load_causal_lm(inputs.model, dtype=placement.dtype).to(placement.device)
    backend = TransformersBackend(policy, plan.tokenizer, config.micro_batch_size)
    scorer = _scorer(config) if any(has_answer(e) for e, _, _ in plan.batch) else None
    modes, records = {}, []
    for mode in config.mode_names:
        modes[mode], mode_records = evaluate_mode(backend, scorer, reward_model, plan, mode)
        records.extend(mode_records)
    summary = {"model": inputs.model, "dataset": inputs.dataset, "reward_model": config.reward_model,
               "reward_type": config.reward_type, "reward_fn": list(config.reward_fn),
               "reward_weights": config.reward_weights, "reward_url": config.reward_url,
               "correct_threshold": config.correct_threshold,
               "reward": reward or reward_line(vars(config), None), "system_prompt": plan.system_prompt,
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
                     "(rows need a label, or gt_answer/test_cases as older files name it, or --label-key naming the "
                     "answer field)")
    elif answered < summary["prompts"]:
        lines.append(f"accuracy, format and reward over the {answered} of {summary['prompts']} prompts with answers")
    if answered:
        lines.append(summary["reward"])
    if not scored:
        lines.append("no --reward-model: reward-model scores skipped")
    lines += [f"summary: {summary['output']}", f"samples: {summary['samples']}"]
    return "\n".join(lines)


def resolve_model_names(config):
    """-m / -rm given as hub names ORG/NAME or GGUF files: their local HF directories (coati/utils/model_source.py)."""
    from coati.utils.model_source import MODEL_SOURCE_ERRORS, with_local_models

    try:
        return with_local_models(config, {"model": "-m", "reward_model": "-rm"})
    except MODEL_SOURCE_ERRORS as err:
        raise ConfigError(str(err)) from None


def parse_options(argv: list[str] | None, prog: str) -> tuple[EvalConfig, str]:
    """(the options, the line naming the reward): the flags, --plugins imported, and on a run's checkpoint the
    run's reward settings for those not given (eval_config.run_reward_defaults)."""
    from coati.config.user_plugins import load_line_plugins, load_user_plugins

    load_line_plugins(argv)  # first: a reward kind they register is an -rt choice
    parser = build_parser(EvalConfig, prog, DESCRIPTION)
    values = vars(parser.parse_args(argv))
    line = run_reward_defaults(values, parser.given)
    load_user_plugins(values["plugins"] or ())  # the run's, when its reward settings were taken
    return construct(EvalConfig, values), line


def main(argv: list[str] | None = None, prog: str = "coati evaluate") -> int:
    from coati.dataset.rows import DatasetError

    try:
        config, line = parse_options(argv, prog)
        config = resolve_model_names(config)
        inputs = check_inputs(config)
        tokenizer = tokenizers(config, inputs)
        plan = prepare(config, inputs, tokenizer)
    except (ConfigError, ConfigFileError, DatasetError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        summary = run(plan, line)
    except ConfigError as err:  # a reward model whose weights lack the head: found when loading it, first
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(format_table(summary))
    return 0

