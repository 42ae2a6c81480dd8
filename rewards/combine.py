"""Several rewards weighted into one: the built-in ``-rt`` reward, the user's functions and a reward server.

reward = sum over rewards of weight * score. Names: the built-in reward by its type (``boxed``,
``think_answer_tags``, ``code``), a user function by its function name, the server ``remote``. Every weight is
1 unless ``--reward-weights name:weight,...`` says otherwise; weight 0 for the built-in reward replaces it
(it is still computed: ``format_ok`` and the reason stay the built-in reward's). ``correct`` becomes the run's
verdict by the rule of rewards/correctness.py: the parts' own verdicts, ``--correct-threshold``, the built-in
reward's while it weighs, else none.
"""

from __future__ import annotations

import dataclasses
import math

from rewards.correctness import sample_correct
from rewards.remote import RemoteReward
from rewards.types import RewardResult, Scored, example_label
from rewards.user import UserReward, load_reward_fn


class RewardWeightsError(ValueError):
    """A bad --reward-weights; one line."""


def parse_weights(text: str | None) -> dict[str, float]:
    """``"boxed:1,length_penalty:0.2"`` -> {name: weight}."""
    weights: dict[str, float] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        name, sep, value = item.strip().rpartition(":")
        try:
            weight = float(value)
        except ValueError:
            weight = math.nan
        if not sep or not name or not math.isfinite(weight):
            raise RewardWeightsError(f"--reward-weights item {item.strip()!r} must be name:weight with a finite "
                                     "number, e.g. boxed:1,length_penalty:0.2")
        if name in weights:
            raise RewardWeightsError(f"--reward-weights names {name!r} twice")
        weights[name] = weight
    return weights


def resolve_weights(names: list[str], given: dict[str, float]) -> dict[str, float]:
    """A weight for each reward in ``names`` (1 unless given); names that are not rewards of this run raise."""
    seen = set()
    for name in names:
        if name in seen:
            raise RewardWeightsError(f"two rewards are called {name!r}; rename one of the functions")
        seen.add(name)
    unknown = [name for name in given if name not in seen]
    if unknown:
        raise RewardWeightsError(f"--reward-weights names {', '.join(map(repr, unknown))}, which is no reward of "
                                 f"this run (rewards: {', '.join(names)})")
    return {name: given.get(name, 1.0) for name in names}


def last_user_text(example) -> str:
    users = [m["content"] for m in example.messages if m.get("role") == "user"]
    return users[-1] if users else ""


class CombinedRewards:
    """The rewards added to the built-in one, and the weights of all of them."""

    def __init__(self, builtin: str, reward_fns=(), reward_url: str | None = None, weights: str | None = None,
                 remote_options: dict | None = None, correct_threshold: float | None = None):
        self.builtin = builtin
        self.correct_threshold = correct_threshold
        self.functions: list[UserReward] = [load_reward_fn(spec) for spec in reward_fns]
        self.remote = RemoteReward(reward_url, **(remote_options or {})) if reward_url else None
        names = [builtin, *(f.name for f in self.functions), *(["remote"] if self.remote else [])]
        self.weights = resolve_weights(names, parse_weights(weights))

    @property
    def trivial(self) -> bool:
        """Only the built-in reward, at weight 1, and its verdict: results pass through unchanged."""
        return (not self.functions and self.remote is None and self.weights[self.builtin] == 1.0
                and self.correct_threshold is None)

    def apply(self, results: list[RewardResult], responses: list[str], examples: list) -> list[RewardResult]:
        """``results[i]`` (built-in) of ``responses[i]`` to ``examples[i]`` -> the weighted results."""
        if self.trivial:
            return results
        scored = [[Scored(r.reward, {}) for r in results]]
        for fn in self.functions:
            scored.append([fn(response, example_label(e), getattr(e, "row", None), e.source or "a row")
                           for response, e in zip(responses, examples)])
        if self.remote is not None:
            scored.append(self.remote.score([{"prompt": last_user_text(e), "response": response,
                                              "label": example_label(e)} for response, e in zip(responses, examples)]))
        names = list(self.weights)
        out = []
        for i, result in enumerate(results):
            parts, total, verdicts = {}, 0.0, []
            for name, column in zip(names, scored):
                score, named, verdict = column[i]
                total += self.weights[name] * score
                parts[name] = score
                parts.update({f"{name}/{key}": value for key, value in named.items()})
                if verdict is not None:
                    verdicts.append(verdict)
                    parts[f"{name}/correct"] = verdict
            correct = sample_correct(result.correct, self.weights[self.builtin], verdicts, total,
                                     self.correct_threshold)
            if self.weights[self.builtin] == 0:
                result = unweighted_builtin(result, correct, total)
            out.append(dataclasses.replace(result, reward=total, parts=parts, correct=correct))
        return out


def unweighted_builtin(result: RewardResult, correct: bool | None, total: float) -> RewardResult:
    """A result whose built-in reward is weighted 0: its format check, extracted answer and reason are the built-in
    kind's (e.g. "no \\boxed{} answer" for a plain-text reply), which decide nothing, so they give way to what the
    weighted rewards decided: no format asked of the response, and the verdict (or the reward) as the reason."""
    reason = {True: "correct", False: "incorrect", None: f"reward {total:g}"}[correct]
    # counted over samples by its short form: one "no verdict", not one entry per graded value
    return dataclasses.replace(result, format_ok=True, extracted=None, reason=reason,
                               cause="no verdict" if correct is None else None)
