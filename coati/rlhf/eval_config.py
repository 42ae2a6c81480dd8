"""The options of ``coati evaluate`` and their checks (paths, rows, models), all before any model is loaded;
the run itself is coati/rlhf/evaluate.py."""

from __future__ import annotations

import os
from dataclasses import dataclass

from coati.config.data import PROMPT_DESTS, REWARD_DESTS, PromptOptions, RewardOptions
from coati.config.errors import ConfigError, require
from coati.utils.dataclass_cli import option
from coati.utils.gguf import GGUF_FILE_HELP
from coati.utils.user_parts import UserParts
from rewards import DEFAULT_REWARD_TYPE, REWARD_TYPES

MODES = {"greedy": 0.0, "sampled": 1.0}  # decoding mode -> temperature (sampled: the training distribution)
DEFAULT_MAX_NEW_TOKENS = {"demo": 8, "model": 1024}  # as `coati train` (the demo's answers are ~6 tokens)
DESCRIPTION = __doc__.split("\n\n")[0] + " No -m/-d: the embedded demo model on its held-out addition problems."


@dataclass(frozen=True)
class EvalConfig(RewardOptions, PromptOptions):
    """The reward options (--reward-fn, --reward-weights, --reward-url, --correct-threshold) and the prompt options
    (--prompt-template, --stop) are coati train's (RewardOptions, PromptOptions); on a run's checkpoint they and -rt
    default to the run's own (``run_reward_defaults``; a prompt option given here replaces only itself)."""

    # `coati sft`/`coati rm` spell this with another meaning (the trainer's rows per forward/backward)
    retired_flags = {"--micro-batch-size": "in coati sft/rm that is the training micro-batch; here "
                                           "-imbs/--inference-microbatch-size sets prompts per generate call"}

    model: str | None = option(None, "checkpoint: an HF causal-LM directory, a hub name ORG/NAME or a .gguf file "
                                     "(default: the embedded demo model)", "-m")
    gguf_file: str | None = option(None, GGUF_FILE_HELP)
    dataset: str | None = option(None, "eval prompts: {\"prompt\": ...} rows or math/code rows (.jsonl, .json list, "
                                       ".parquet, save_to_disk); required with -m", "-d")
    reward_type: str = option(DEFAULT_REWARD_TYPE, "verifiable reward of the rows that have answers (default: on a "
                                                   "run's checkpoint, the run's own -rt and reward options)", "-rt",
                              choices=REWARD_TYPES)
    input_key: str | None = option(None, "field holding the prompt (default: messages, else prompt)")
    label_key: str | None = option(None, "field holding the answer; every row must have it (default: label, or the "
                                         "kind's older name gt_answer, test_cases with -rt code, used where present)")
    reward_model: str | None = option(None, "reward model directory (`coati rm` output) scoring every response", "-rm")
    modes: str = option("both", "decoding: greedy (temperature 0), sampled (temperature 1) or both",
                        choices=("greedy", "sampled", "both"))
    system_prompt: str | None = option(None, "system prompt (default: the -rt type's own for a model with a chat "
                                             "template, as `coati train -m` uses; none without one)", "-s")
    max_new_tokens: int | None = option(None, "tokens per response (default: 8 for the embedded demo, else 1024, "
                                              "capped to the model's max_position_embeddings)", "-mnt")
    max_prompt_tokens: int = option(512, "prompts longer than this are skipped and counted", "-mpt")
    num_prompts: int = option(0, "evaluate the first N prompts only (0: all)", "-n")
    micro_batch_size: int = option(32, "prompts per generate call and rows per reward-model forward", "-imbs",
                                   flag="--inference-microbatch-size")
    seed: int = option(42, "sampling seed of the sampled mode")
    model_dtype: str = option("auto", "dtype of the policy and the reward model: auto = fp32 on the CPU, bf16 on a "
                                      "GPU", choices=("auto", "fp32", "bf16", "fp16"))
    output: str | None = option(None, "JSON summary path; the samples go to <its name>.samples.jsonl (default: "
                                      "<checkpoint's parent>/evals/<checkpoint>_<eval file>.json)", "-o")
    parts: UserParts = UserParts()  # --plugins, imported before anything is checked

    @property
    def mode_names(self) -> tuple[str, ...]:
        return tuple(MODES) if self.modes == "both" else (self.modes,)


@dataclass
class Inputs:
    model: str
    dataset: str
    examples: list  # coati.dataset.rows.Example; label None when the row has no answer
    output: str



RUN_OPTIONS = "run_state.json"  # a run's checkpoint keeps the run's options there (coati/launcher/checkpoints.py)


def run_reward_defaults(values: dict, given: set[str]) -> str:
    """On a run's checkpoint (-m DIR holding the run's saved options) with no reward option ``given`` here, the
    run's reward settings, written into ``values`` (by dest); the one line saying which reward scores. A reward
    given here replaces the run's whole (a user function's verdict would otherwise still decide correctness)."""
    import json

    model, saved = values.get("model"), None
    path = os.path.join(model, RUN_OPTIONS) if model else None
    if path and os.path.isfile(path):
        try:
            with open(path, encoding="utf-8") as handle:
                saved = json.load(handle).get("options")
        except (OSError, ValueError):
            saved = None
    if not saved:
        return reward_line(values, None)
    for dest in PROMPT_DESTS:  # the run's prompts, as it trained on them
        if dest in saved and dest not in given:
            values[dest] = saved[dest]
    if given & set(REWARD_DESTS):
        return reward_line(values, f"given here, instead of the run's own in {path}")
    for dest in REWARD_DESTS:
        if dest in saved:
            values[dest] = saved[dest]
    # the run's --plugins too: its -rt kind may be one they register (imported after this, by parse_options)
    values["plugins"] = tuple(dict.fromkeys((*(values.get("plugins") or ()), *(saved.get("plugins") or ()))))
    return reward_line(values, f"the run's own, from {path}; a reward option given here replaces it")


def reward_line(values: dict, source: str | None) -> str:
    """``reward: -rt boxed:0 + my_reward.py:fn ...``: what scores the responses, and where that came from."""
    from rewards.combine import RewardWeightsError, parse_weights

    try:
        weights = parse_weights(values.get("reward_weights"))
    except RewardWeightsError:  # check_inputs says what is wrong with them
        weights = {}

    def weighted(name: str, shown: str) -> str:
        return shown + (f" x{weights[name]:g}" if name in weights else "")

    parts = [weighted(values["reward_type"], f"-rt {values['reward_type']}")]
    parts += [weighted(spec.rpartition(":")[2], spec) for spec in values.get("reward_fn") or ()]
    if values.get("reward_url"):
        parts.append(weighted("remote", values["reward_url"]))
    threshold = values.get("correct_threshold")
    return ("reward: " + " + ".join(parts) + (f"; correct when >= {threshold:g}" if threshold is not None else "")
            + (f" ({source})" if source else ""))


def _model_problem(path: str) -> str | None:
    from coati.models.lora import adapter_base, is_adapter_dir
    from coati.rollout.reward_model import read_model_config

    if is_adapter_dir(path):  # a LoRA checkpoint: its base model must be here
        config, problem = read_model_config(adapter_base(path), f"the base model of the LoRA adapter {path}",
                                            "train and evaluate on the same machine, or merge it first: coati export "
                                            "--merge")
    else:
        config, problem = read_model_config(path, "model", "pass -m an HF directory, e.g. runs/sft/final")
    if problem:
        return problem
    architectures = config.get("architectures") or []
    if any(name.endswith("ForSequenceClassification") for name in architectures):
        return f"{path} is a reward model ({architectures[0]}), not a causal LM: pass it as --reward-model"
    if not any(os.path.isfile(os.path.join(path, name)) for name in ("tokenizer.json", "tokenizer_config.json")):
        return (f"{path} has no tokenizer files (tokenizer.json / tokenizer_config.json): "
                "save the tokenizer beside the model")
    return None


def default_output(model: str, dataset: str, embedded: bool) -> str:
    stem = os.path.splitext(os.path.basename(os.path.normpath(dataset)))[0]
    if embedded:
        return os.path.join("runs", "evals", f"demo_{stem}.json")
    checkpoint = os.path.normpath(os.path.abspath(model))
    return os.path.join(os.path.dirname(checkpoint), "evals", f"{os.path.basename(checkpoint)}_{stem}.json")


def samples_path(output: str) -> str:
    return os.path.splitext(output)[0] + ".samples.jsonl"


def check_inputs(config: EvalConfig, log=print) -> Inputs:
    """Options, paths and every row, without loading a model; ConfigError/DatasetError name the problem."""
    from coati.dataset.rlhf_rows import load_prompts
    from coati.dataset.rows import RowFormat
    from coati.rollout.reward_model import reward_model_problem

    for flag, value in (("-mpt/--max-prompt-tokens", config.max_prompt_tokens),
                        ("-imbs/--inference-microbatch-size", config.micro_batch_size),
                        ("-mnt/--max-new-tokens", 1 if config.max_new_tokens is None else config.max_new_tokens)):
        require(value >= 1, f"{flag} must be at least 1, got {value}")
    require(config.num_prompts >= 0, f"-n/--num-prompts must be >= 0 (0: all), got {config.num_prompts}")
    from coati.config.validate import check_prompt_options, check_reward_options

    require(config.reward_type in REWARD_TYPES,
            f"-rt {config.reward_type!r} is no registered reward kind (choose one of {', '.join(REWARD_TYPES)}): pass "
            "the --plugins file that registers it")
    check_reward_options(config, config.reward_type)
    check_prompt_options(config, config.system_prompt)
    embedded = config.model is None
    require(embedded or config.dataset is not None, "-d/--dataset is required with -m/--model (a file of prompts)")
    problem = None if embedded else _model_problem(config.model)
    require(problem is None, problem)
    if config.reward_model is not None:
        problem = reward_model_problem(config.reward_model)
        require(problem is None, problem)
    model, dataset = config.model, config.dataset
    row_format = RowFormat(reward_type=config.reward_type, label_key=config.label_key)
    # the user's rows are read before the embedded model is built
    examples = None if dataset is None else load_prompts(dataset, row_format, config.input_key)
    if embedded or dataset is None:
        from coati.demo.math_demo import ensure_demo_assets

        demo = ensure_demo_assets(log=log)
        model, dataset = model or demo.model_dir, dataset or demo.eval_path
    if examples is None:
        examples = load_prompts(dataset, row_format, config.input_key)
    if config.num_prompts:
        examples = examples[: config.num_prompts]
    return Inputs(model, dataset, examples, config.output or default_output(model, dataset, embedded))


def tokenizers(config: EvalConfig, inputs: Inputs):
    """The checkpoint's tokenizer; the reward model's must map text to the same ids (its scores read them)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(inputs.model)
    if config.reward_model and os.path.isfile(os.path.join(config.reward_model, "tokenizer.json")):
        if AutoTokenizer.from_pretrained(config.reward_model).get_vocab() != tokenizer.get_vocab():
            raise ConfigError(f"the reward model's tokenizer ({config.reward_model}) differs from the checkpoint's: "
                              "it scores the generated token ids, so both need the same vocabulary")
    return tokenizer
