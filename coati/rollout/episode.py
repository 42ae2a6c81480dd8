"""Token-in, token-out multi-turn episodes: the model and an environment take turns on one token sequence.

Every turn generates from the ids so far (prompt + every earlier turn's sampled ids + every observation's
ids): earlier turns are never re-tokenised, so the ids the trainer sees are exactly the ids sampled. A turn
ends at EOS, at one of the environment's stop strings (the closing tool-call tag, kept in the output) or at
``max_new_tokens``. The environment's observation is tokenised on its own and appended with loss mask 0 and
logprob 0; the model's tokens have mask 1 and their behaviour logprobs.

An episode ends when the environment says done or the model ends a turn with EOS (finish "stop"), or when a
budget runs out (finish "length", like a truncated single-turn response): a turn cut at ``max_new_tokens``,
``max_turns`` model turns, more than ``max_tool_calls`` tool calls (the extra call is not run), or
``max_tokens`` response tokens (model and environment together). ``info["stop"]`` says which.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Callable

from coati.rollout.group import RolloutGroup


@dataclass(frozen=True)
class EpisodeBudget:
    max_turns: int = 4
    max_tool_calls: int = 4
    max_tokens: int = 512  # response tokens of an episode, the environment's included

    def __post_init__(self):
        for name in ("max_turns", "max_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.max_tool_calls < 0:
            raise ValueError("max_tool_calls must be >= 0")


@dataclass
class Episode:
    prompt_ids: list[int]
    env: object
    ids: list[int] = field(default_factory=list)  # response: model and environment tokens, in order
    mask: list[int] = field(default_factory=list)  # 1 = the model wrote it (trained), 0 = the environment's
    logprobs: list[float] = field(default_factory=list)
    turns: list[dict] = field(default_factory=list)
    reward: float = 0.0
    finish_reason: str = ""  # "" while running, then "stop" or "length"
    stop: str = ""
    tool_calls: int = 0

    def append(self, ids: list[int], logprobs: list[float] | None) -> None:
        self.ids += ids
        self.mask += [0 if logprobs is None else 1] * len(ids)
        self.logprobs += [0.0] * len(ids) if logprobs is None else list(logprobs)

    def end(self, finish_reason: str, stop: str) -> None:
        self.finish_reason, self.stop = finish_reason, stop

    @property
    def model_text(self) -> str:
        return "".join(turn["model"] for turn in self.turns)

    def transcript(self) -> str:
        return "".join(turn["model"] + turn.get("observation", "") for turn in self.turns)


def episode_budget(config) -> EpisodeBudget:
    """The budget an RLConfig's --max-turns, --max-tool-calls and --max-episode-tokens set."""
    e = config.episodes
    return EpisodeBudget(e.max_turns, e.max_tool_calls, e.max_episode_tokens)


def episode_system_prompt(env_class, config) -> str:
    """The run's system prompt, followed by the environment's description of its tools (when it has one)."""
    system = config.data.system_prompt
    describe = getattr(env_class, "tool_prompt", None) if env_class is not None else None
    if describe is None:
        return system
    tools = describe(env_class())
    return f"{system}\n\n{tools}" if system else tools


def start_episode(prompt_ids: list[int], env, row, encode: Callable[[str], list[int]]) -> Episode:
    episode = Episode(list(prompt_ids), env)
    first = env.reset(row)
    if first:
        episode.append(encode(first), None)
    return episode


def _turn_params(sampling, envs, turn: int):
    stops = tuple(dict.fromkeys(s for env in envs for s in getattr(env, "stop_strings", ())))
    seed = None if sampling.seed is None else sampling.seed + 7919 * turn
    return dataclasses.replace(sampling, n=1, stop_strings=tuple(dict.fromkeys((*sampling.stop_strings, *stops))),
                               seed=seed)


def take_turn(episode: Episode, completion, budget: EpisodeBudget, eos_id: int, version: int,
              encode: Callable[[str], list[int]], decode: Callable[[list[int]], str]) -> None:
    """Append one model turn (``completion``), let the environment answer, and end the episode if due."""
    room = max(budget.max_tokens - len(episode.ids), 0)  # the reset observation alone may fill the budget
    tokens, logprobs = completion.token_ids[:room], completion.logprobs[:room]
    episode.append(tokens, logprobs)
    text = decode(tokens)
    turn = {"model": text, "tokens": len(tokens), "version": version}
    episode.turns.append(turn)
    if len(tokens) < len(completion.token_ids) or completion.finish_reason == "length":
        return episode.end("length", "max_tokens" if len(tokens) < len(completion.token_ids) else "turn_length")
    result = episode.env.step(text)
    episode.reward += float(result.reward)
    turn.update({k: v for k, v in result.info.items() if k in ("tool_call", "tool_error", "tool_timeout", "tool_s")})
    if result.done or (tokens and tokens[-1] == eos_id):
        return episode.end("stop", "done" if result.done else "eos")
    if "tool_call" in result.info:
        episode.tool_calls += 1
    observation = encode(result.observation) if result.observation else []
    if episode.tool_calls > budget.max_tool_calls:
        return episode.end("length", "max_tool_calls")
    if len(episode.turns) >= budget.max_turns:
        return episode.end("length", "max_turns")
    if len(episode.ids) + len(observation) >= budget.max_tokens:
        return episode.end("length", "max_tokens")
    turn.update(observation=result.observation, observation_tokens=len(observation))
    episode.append(observation, None)


def run_episodes(backend, episodes: list[Episode], sampling, budget: EpisodeBudget,
                 version: Callable[[], int] | int = 0) -> list[Episode]:
    """Play ``episodes`` to the end, batching every turn of the episodes still running into one generate call.

    ``version``: the weights version (or a callable giving the current one, read at every turn)."""
    tokenizer = backend.tokenizer
    encode = lambda text: tokenizer(text, add_special_tokens=False).input_ids  # noqa: E731
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    for turn in range(budget.max_turns):
        active = [e for e in episodes if not e.finish_reason]
        if not active:
            break
        current = version() if callable(version) else version
        outputs = backend.generate([e.prompt_ids + e.ids for e in active],
                                   _turn_params(sampling, [e.env for e in active], turn))
        for episode, (completion,) in zip(active, outputs):
            take_turn(episode, completion, budget, tokenizer.eos_token_id, current, encode, decode)
    return episodes


def episode_groups(backend, env_factory: Callable[[], object], batch, sampling, budget: EpisodeBudget,
                   version: Callable[[], int] | int = 0, learner: bool = False) -> list[RolloutGroup]:
    """``sampling.n`` episodes for each (example, prompt text, prompt ids) of ``batch``, as one group per
    prompt. Rewards are the environments' (they see only the model's own text)."""
    encode = lambda text: backend.tokenizer(text, add_special_tokens=False).input_ids  # noqa: E731
    start = time.perf_counter()
    episodes = [start_episode(ids, env_factory(), example, encode)
                for example, _, ids in batch for _ in range(sampling.n)]
    run_episodes(backend, episodes, sampling, budget, version)
    seconds = (time.perf_counter() - start) / max(1, len(batch))
    groups = []
    for index, (example, text, ids) in enumerate(batch):
        mine = episodes[index * sampling.n : (index + 1) * sampling.n]
        rewards = [e.reward for e in mine]
        versions = [t["version"] for e in mine for t in e.turns]
        groups.append(RolloutGroup(
            prompt_ids=list(ids), responses=[e.ids for e in mine], logprobs=[e.logprobs for e in mine],
            rewards=rewards,
            correct=[r > 0 for r in rewards], format_ok=[e.finish_reason == "stop" for e in mine],
            finish_reasons=[e.finish_reason for e in mine],
            policy_version=min(versions) if versions else (version() if callable(version) else version),
            texts=[e.transcript() for e in mine], prompt_text=text, source=example.source, learner=learner,
            generate_s=seconds, loss_masks=[e.mask for e in mine],
            turns=[[dict(t, stop=e.stop) if i == len(e.turns) - 1 else t for i, t in enumerate(e.turns)]
                   for e in mine]))
    return groups
