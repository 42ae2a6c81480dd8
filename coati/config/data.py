"""What the run trains and scores: the model, the training and held-out data, the reward and its sandbox."""

from __future__ import annotations

import json
import os
import re
from dataclasses import MISSING, dataclass

from coati.config.errors import ConfigError, require
from coati.config.lora import LoraConfig
from coati.dataset.rows import RowFormat
from coati.utils.dataclass_cli import option
from coati.utils.gguf import GGUF_FILE_HELP
from rewards import DEFAULT_REWARD_TYPE, REWARD_TYPES, reward_type


@dataclass(frozen=True)
class ModelConfig:
    path: str = option(MISSING, "HF model: a local directory, a hub name ORG/NAME (taken from the Hugging Face "
                                "cache or downloaded into it) or a .gguf file (converted once into the cache) "
                                "(default: the embedded demo model)", "-m", flag="--model", resolved=True)
    revision: str | None = option(None, "with -m ORG/NAME: the hub revision, a branch, tag or commit (default: main)")
    gguf_file: str | None = option(None, GGUF_FILE_HELP)
    is_embedded_demo: bool = False
    lora: LoraConfig = LoraConfig()  # adapters instead of full fine-tuning (--lora-rank)
    # an RL run's only (the SFT/RM stages have no engine): LoraConfig is shared with them
    lora_sync: str = option(
        "auto", "with --lora-rank: how a weight version reaches the inference engines: adapters (the adapter "
                "tensors alone, loaded in place), merged (merged into the base, full weights each version), or auto: "
                "by what each costs (coati/config/lora_sync.py; the start line says which and why)",
        choices=("auto", "adapters", "merged"))


@dataclass(frozen=True)
class CodeRewardConfig:
    """Sandbox limits and scoring of ``-rt code`` (see rewards/code); per program run on one test case."""

    all_or_nothing: bool = option(False, "-rt code: reward 1 only when every test case passes (default: grows with "
                                         "the fraction passed)", flag="--code-all-or-nothing")
    cpu_seconds: int = option(2, "-rt code: CPU seconds per program run", flag="--code-cpu-seconds")
    wall_seconds: float = option(4.0, "-rt code: wall-clock seconds per program run", flag="--code-wall-seconds")
    memory_mb: int = option(1024, "-rt code: address space per process (raise for numpy)", flag="--code-memory-mb")
    max_processes: int = option(16, "-rt code: processes/threads a program may own", flag="--code-max-processes")
    workers: int | None = option(None, "-rt code: sandboxed runs in parallel (default: one per core)",
                                 flag="--code-workers")

    def scorer_options(self) -> dict:
        from rewards.code import SandboxLimits

        limits = SandboxLimits(cpu_time_s=self.cpu_seconds, wall_time_s=self.wall_seconds,
                               address_space_bytes=self.memory_mb << 20, max_processes=self.max_processes)
        return {"limits": limits, "all_or_nothing": self.all_or_nothing, "max_workers": self.workers}


@dataclass(frozen=True, kw_only=True)
class RewardOptions:
    """The reward options of every command that scores (coati train/ppo and the RLHF pipeline's ppo stage through
    DataConfig, coati evaluate through EvalConfig): one set of fields, inherited, so that the flags, their help and
    their checks (coati/config/validate.check_reward_options) are the same everywhere."""

    reward_fn: tuple[str, ...] = option(
        (), "your own reward: path/to/file.py:function, called as function(response, label, row) -> number (or "
            "(number, {name: number}) for the logs, with \"correct\": bool its verdict for accuracy); repeatable; "
            "added to -rt's reward (see docs/rewards.md)",
        kind=str, repeat=True, metavar="FILE.py:NAME")
    reward_weights: str | None = option(
        None, "weights of the rewards, name:weight,... (names: the -rt type, each --reward-fn function's name, "
              "remote); every weight is 1 unless given; '-rt-type:0' (e.g. boxed:0) replaces the built-in reward")
    reward_url: str | None = option(None, "remote reward server: batches of {prompt, response, label} POSTed as JSON "
                                          "to http://HOST:PORT/PATH, scores back (docs/rewards.md)")
    reward_url_timeout: float = option(30.0, "--reward-url: seconds to wait for one reply")
    reward_url_retries: int = option(3, "--reward-url: more tries after a failed request before the run stops")
    correct_threshold: float | None = option(
        None, "a response counts as correct (accuracy) when its weighted reward is >= this, unless a reward part "
              "gives its own verdict (default: the built-in -rt verdict while its weight is not 0; docs/rewards.md)")

    @property
    def added_reward_names(self) -> tuple[str, ...]:
        """The names of the rewards added to the built-in one, as --reward-weights and the logs call them: each
        --reward-fn function's, and ``remote`` for --reward-url."""
        return (*(spec.rpartition(":")[2] for spec in self.reward_fn), *(("remote",) if self.reward_url else ()))

    def reward_options(self) -> dict:
        """RewardScorer's keyword arguments for the user's rewards (functions, server, weights, threshold)."""
        return {"reward_fns": self.reward_fn, "reward_url": self.reward_url, "reward_weights": self.reward_weights,
                "remote_options": {"timeout_s": self.reward_url_timeout, "retries": self.reward_url_retries},
                "correct_threshold": self.correct_threshold}


# What a run's checkpoint keeps (its saved options, by dest) that `coati evaluate` takes by default: its prompts,
# and its reward settings.
PROMPT_DESTS = ("prompt_template", "stop")
REWARD_DESTS = ("reward_type", "reward_fn", "reward_weights", "reward_url", "reward_url_timeout",
                "reward_url_retries", "correct_threshold")


@dataclass(frozen=True, kw_only=True)
class PromptOptions:
    """How a row becomes a base model's prompt and where its response ends, for every command that generates from
    rows (coati train/ppo through DataConfig, coati evaluate through EvalConfig): one set of fields, inherited, and
    one check (coati/config/validate.check_prompt_options)."""

    prompt_template: str | None = option(
        None, "a base model's prompt: the text it continues, {prompt} standing for the row's text and {system} for "
              "-s, e.g. 'Q: {prompt}\\nA:' (the chat template is not used; docs/data.md, base models)")
    stop: tuple[str, ...] = option(
        (), "end a response at this text, as at EOS (kept in the response; counts as a natural end, not a "
            "truncation), in training and evaluation: a base model never emits EOS after its answer, e.g. --stop "
            "$'\\nQ:'; repeatable (a YAML list); added to the -rt type's own stops", kind=str, repeat=True,
        metavar="STR")

    def stop_strings(self, reward_type: str) -> tuple[str, ...]:
        """Where a response ends besides EOS: the -rt kind's own stops (none for a name not registered: the
        checks refuse it), then --stop's, each once."""
        spec = REWARD_TYPES.get(reward_type)
        return tuple(dict.fromkeys((*(spec.stop_strings if spec else ()), *self.stop)))


@dataclass(frozen=True)
class DataConfig(RewardOptions, PromptOptions):
    train_path: str = option(
        MISSING, "training data: .jsonl, .json (a list of objects), .parquet or a datasets save_to_disk directory, "
                 "local only (default: the embedded addition task)", "-d", flag="--dataset", resolved=True)
    # task name -> dataset (see coati.dataset.loader for the formats); the flag is its JSON text
    eval_paths: dict[str, str] = option(
        MISSING, 'JSON mapping task name -> dataset (same formats as -d), e.g. \'{"math": "eval.parquet"}\' '
                 "(default: the demo's held-out split)", "-ed", flag="--eval-dataset", kind=str, resolved=True,
        json_text=True)
    # the registry itself, not a copy: a kind registered later (a user's) is a choice too
    reward_type: str = option(DEFAULT_REWARD_TYPE, "how responses are checked", "-rt", choices=REWARD_TYPES)
    system_prompt: str = option("", "system prompt (default: the reward type's own; none for the embedded demo)",
                                "-s", resolved=True)
    max_prompt_tokens: int = option(512, "longer prompts are skipped (and counted); default: 64 for the demo, "
                                         "else 512", "-mpt", resolved=True)
    code: CodeRewardConfig = CodeRewardConfig()
    input_key: str = option(
        "messages", "row field holding the prompt: a string, a role/content object or a chat list ending with the "
                    "user's turn (e.g. --input-key question for GSM8K, problem for MATH)")
    label_key: str | None = option(
        None, "row field holding the answer; for math rewards a plain answer, or a solution ending in '#### 72' "
              "(GSM8K) or \\boxed{...} (MATH, the last box counts), e.g. --label-key answer / solution "
              "(default: label, or the kind's older name: gt_answer for math, test_cases with -rt code)")

    @property
    def builtin_reward_counts(self) -> bool:
        """Whether the built-in -rt reward is part of the reward (its weight is not 0): only then are its
        format verdict and its all-zero groups the user's concern."""
        from rewards.combine import parse_weights

        return parse_weights(self.reward_weights).get(self.reward_type, 1.0) != 0

    @property
    def rows(self) -> RowFormat:
        return RowFormat(reward_type=self.reward_type, input_key=self.input_key, label_key=self.label_key)

    @property
    def reward_url_give_up_s(self) -> float:
        """The longest the reward server's tries take before the scorer gives up (0: no server)."""
        from rewards.remote import give_up_s

        return give_up_s(self.reward_url_timeout, self.reward_url_retries) if self.reward_url else 0.0

    def scorer_options(self) -> dict:
        """RewardScorer's keyword arguments for this run (built-in reward, user functions, server)."""
        return {"reward_type": self.reward_type,
                "code_options": self.code.scorer_options() if reward_type(self.reward_type).needs_sandbox else None,
                **self.reward_options()}


def parse_eval_datasets(text: str | None) -> dict[str, str]:
    """``'{"name": "path.jsonl", ...}'`` -> mapping. Names become file names (``<name>_<mode>_step<N>.jsonl``),
    so they must be plain file names; every path must be an existing file (parsed in full by check_inputs)."""
    if not text:
        return {}
    flag = "-ed/--eval-dataset"
    duplicates = []

    def pairs(items):
        names = [name for name, _ in items]
        duplicates.extend(name for name in set(names) if names.count(name) > 1)
        return dict(items)

    try:
        mapping = json.loads(text, object_pairs_hook=pairs)
    except json.JSONDecodeError as err:
        raise ConfigError(f"{flag} is not valid JSON ({err.msg} at column {err.colno}); "
                          "pass e.g. '{\"math\": \"eval.jsonl\"}'") from None
    require(isinstance(mapping, dict) and mapping, f"{flag} must be a non-empty JSON object of task name -> jsonl "
                                                    "path, e.g. '{\"math\": \"eval.jsonl\"}'")
    if duplicates:
        raise ConfigError(f"{flag} names task {sorted(duplicates)[0]!r} twice")
    for name, path in mapping.items():
        require(bool(re.fullmatch(r"[A-Za-z0-9._-]+", name)) and name not in (".", ".."),
                 f"{flag} task name {name!r} is not a valid file name (use letters, digits, . _ -)")
        require(isinstance(path, str) and path != "", f"{flag} path for task {name!r} must be a non-empty string")
        require(os.path.exists(path), f"{flag} file for task {name!r} not found: {path}")
    return mapping
