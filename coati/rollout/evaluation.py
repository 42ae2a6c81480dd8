"""Held-out evaluation: accuracy and format rate of one backend on a list of examples."""

from __future__ import annotations

from dataclasses import dataclass, field

from coati.config.sampling import SamplingParams
from coati.rollout.inference_backend import Completion, InferenceBackend
from rewards.correctness import NOT_DEFINED, accuracy, accuracy_text
from rewards.scorer import RewardScorer


# The numbers an evaluation reports, in the order its row logs them; a None one (accuracy when no reward defines
# correctness, rm_score without a reward model, tool_use_rate without --env) is left out.
EVAL_NUMBERS = ("accuracy", "format_rate", "mean_reward", "rm_score", "tool_use_rate")


@dataclass
class EvalResult:
    accuracy: float | None  # None: no reward of the run defines correctness (rewards/correctness.py)
    format_rate: float
    mean_reward: float
    records: list[dict] = field(default_factory=list)  # prompt, response, extracted answer, reward per sample
    rm_score: float | None = None  # the reward model's mean score of the responses (when one is given)
    tool_use_rate: float | None = None  # with --env: the share of episodes that called a tool

    def summary(self) -> dict:
        """The numbers an eval row logs (EVAL_NUMBERS that are not None)."""
        return {name: getattr(self, name) for name in EVAL_NUMBERS if getattr(self, name) is not None}


def evaluate(backend: InferenceBackend, prompts: list[list[int]], examples, scorer: RewardScorer,
             params: SamplingParams, prompt_texts: list[str] | None = None, reward_model=None) -> EvalResult:
    """One completion per prompt (``params.n`` is forced to 1) scored with the training reward, and with
    ``reward_model`` ((prompt ids list, response ids list) -> scores, as the PPO producers use) when given."""
    if params.n != 1:
        params = SamplingParams(**{**params.__dict__, "n": 1})
    outputs = backend.generate(prompts, params)
    result = score_outputs(outputs, examples, scorer, prompt_texts)
    if reward_model is not None and outputs:
        scores = reward_model(prompts, [completions[0].token_ids for completions in outputs])
        for record, score in zip(result.records, scores):
            record["rm_score"] = score
        result.rm_score = sum(scores) / len(scores)
    return result


def score_outputs(outputs: list[list[Completion]], examples, scorer: RewardScorer,
                  prompt_texts: list[str] | None = None) -> EvalResult:
    """``evaluate``'s scoring of completions already generated (``outputs[i][0]`` answers ``examples[i]``), for
    callers that also need the token ids (``coati evaluate`` scores them with a reward model)."""
    results = scorer.score_each([completions[0].text for completions in outputs], examples)
    records = []
    for i, (completions, result, example) in enumerate(zip(outputs, results, examples)):
        completion = completions[0]
        records.append({
            "prompt": prompt_texts[i] if prompt_texts else None,
            "gt_answer": example.gt_answer,  # a math label as scored (GSM8K/MATH: their final answer); else None
            "response": completion.text,
            "extracted": result.extracted,
            "reward": result.reward,
            "correct": result.correct,
            "format_ok": result.format_ok,
            "reason": result.reason,
            "reason_code": result.reason_code,
            "finish_reason": completion.finish_reason,
            **({"reward_parts": result.parts} if result.parts is not None else {}),
        })
    count = max(len(records), 1)
    return EvalResult(
        accuracy=accuracy(r["correct"] for r in records) if records else 0.0,
        format_rate=sum(r["format_ok"] for r in records) / count,
        mean_reward=sum(r["reward"] for r in records) / count,
        records=records,
    )


def evaluate_episodes(backend, env_class, batch, params: SamplingParams, budget) -> EvalResult:
    """With ``--env``: one episode per (example, prompt text, prompt ids) of ``batch``, graded by the environment.
    accuracy: episodes with a reward > 0; format_rate: episodes the environment or EOS ended (not a budget)."""
    from coati.rollout.env import make_env
    from coati.rollout.episode import episode_groups

    if params.n != 1:
        params = SamplingParams(**{**params.__dict__, "n": 1})
    groups = episode_groups(backend, lambda: make_env(env_class), batch, params, budget)
    records = [{"prompt": text, "gt_answer": example.gt_answer, "response": group.texts[0],
                "reward": group.rewards[0], "correct": group.correct[0], "format_ok": group.format_ok[0],
                "finish_reason": group.finish_reasons[0], "turns": group.turns[0]}
               for (example, text, _), group in zip(batch, groups)]
    count = max(len(records), 1)
    return EvalResult(accuracy=sum(r["correct"] for r in records) / count,
                      format_rate=sum(r["format_ok"] for r in records) / count,
                      mean_reward=sum(r["reward"] for r in records) / count, records=records,
                      tool_use_rate=sum(any("tool_call" in t for t in r["turns"]) for r in records) / count)


def held_out_row(backend, examples, skipped: int, params: SamplingParams, scorer: RewardScorer, version: int,
                 reward_model=None, env_class=None, budget=None) -> dict:
    """One held-out evaluation as producers, colocated ranks and the evaluator report it: the numbers, the prompt
    count, the prompts skipped as too long, the weights version and the records, for the tokenised ``examples``
    ((example, prompt text, prompt ids)); episodes with an environment (``env_class``, ``budget``)."""
    if env_class is not None:
        result = evaluate_episodes(backend, env_class, examples, params, budget)
    else:
        result = evaluate(backend, [ids for _, _, ids in examples], [e for e, _, _ in examples], scorer, params,
                          prompt_texts=[text for _, text, _ in examples], reward_model=reward_model)
    return {**result.summary(), "count": len(examples), "skipped_too_long": skipped, "version": version,
            "records": result.records}


def held_out_line(key: str, before: dict, after: dict) -> str:
    """The final summary's line for eval ``key`` ("task/mode") from its first and last eval numbers
    (``EvalResult.summary()``): accuracy before -> after, or the mean reward when no reward defines correctness."""
    if before.get("accuracy") is not None and after.get("accuracy") is not None:
        a, b = before["accuracy"], after["accuracy"]
        return f"held-out accuracy {key}: {a:.3f} -> {b:.3f} ({100 * (b - a):+.1f} points)"
    a, b = before.get("mean_reward"), after.get("mean_reward")
    reward = f"{a:.3f} -> {b:.3f} ({b - a:+.3f})" if a is not None and b is not None else "unknown"
    if before.get("accuracy") is None and after.get("accuracy") is None:
        why = ("no reward of this run defines correctness: return (score, {\"correct\": bool}) from --reward-fn, "
               "or set --correct-threshold")
    else:
        why = f"before {accuracy_text(before.get('accuracy'))}, after {accuracy_text(after.get('accuracy'))}"
    return f"held-out mean reward {key}: {reward}; accuracy {NOT_DEFINED} ({why})"
