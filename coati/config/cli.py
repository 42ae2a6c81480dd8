"""Command-line flags (ColossalChat's names, long and short) or a mapping -> a validated RLConfig.

Every flag is the ``option()`` metadata of the RLConfig field it sets (coati/utils/dataclass_cli.py makes the
flags, ``--config FILE.yaml`` and the YAML keys from it), so a new knob is one field. What stays here is what
one field cannot say: defaults that depend on the situation (the embedded demo, the code demo, a user's model)
and the -a preset < --grpo-config < dedicated flags precedence of the algorithm's fields.

Two doors, one path: ``config_from_args`` (parsed flags) and ``config_from_dict`` (a mapping of the same keys as
``--config`` YAML: a pipeline file's section, a dict built in code) both end in ``config_from_values``, so the
precedence, the situation's defaults and the checks are the same.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from coati.config.algo import AlgoConfig
from coati.config.batch_defaults import BATCHES, follow_given
from coati.config.data import DataConfig, ModelConfig, parse_eval_datasets
from coati.config.env import TOOL_DEMO_ENVS
from coati.config.errors import ConfigError
from coati.config.grpo_config import build_algo_config, grpo_config_help, grpo_keys, parse_grpo_config
from coati.config.layout import ParallelConfig
from coati.config.ppo import PPOConfig
from coati.config.sampling import SamplingParams
from coati.config.tree import RLConfig
from coati.config.user_plugins import load_user_plugins, plugins_of_mapping
from coati.config.validate import validate
from coati.config.validate_algo import check_families
from coati.registry.backends import DEFAULT_BACKEND
from coati.utils import dataclass_cli
from coati.utils.dataclass_cli import construct, option
from coati.utils.user_parts import UserParts, UserPartsError
from rewards import REWARD_TYPES, default_system_prompt

# Defaults that differ between the embedded demo (no --model) and a user's model, for the flags declared
# with option(..., resolved=True) whose help names them.
_BATCHES = {"inference_batch_size": 64, "inference_microbatch_size": 64, "train_batch_size": 32,
            "train_minibatch_size": 32, "train_microbatch_size": 256}
# The demos' tiny models: vLLM's engine starts cost more than its rounds save (docs/results.md, The
# default engine); a user's model starts from the first row, which coati/launcher/preflight.choose_engine
# replaces with the fastest engine installed that serves it (that needs the model's config.json and the engines).
_ENGINE = {"backend": DEFAULT_BACKEND}
DEMO_DEFAULTS = {"learning_rate": 3e-4, "max_new_tokens": 8, "max_prompt_tokens": 64, "num_episodes": 3,
                 "ppo_epochs": None, **_BATCHES, **_ENGINE}
MODEL_DEFAULTS = {"learning_rate": 1e-6, "max_new_tokens": 1024, "max_prompt_tokens": 512, "num_episodes": 1,
                  "ppo_epochs": None, **_BATCHES, **_ENGINE}
# -rt code without a model: the code demo (coati/demo/code_demo.py). Every sample runs in the sandbox, so
# samples are dear: small rounds and 4 passes over each batch get the most out of the ~3,000 it draws.
CODE_DEMO_DEFAULTS = {"learning_rate": 3e-4, "max_new_tokens": 16, "max_prompt_tokens": 64, "num_episodes": 2,
                      "ppo_epochs": 4, "inference_batch_size": 16, "inference_microbatch_size": 16,
                      "train_batch_size": 8, "train_minibatch_size": 8, "train_microbatch_size": 64, **_ENGINE}
# --env tool_demo without a model: the tool demo (coati/demo/tool_demo.py). A turn is at most 9 tokens (a call,
# or an answer with EOS); one decision (call the tool or not) is learned within ~15 steps of 32 prompts.
TOOL_DEMO_DEFAULTS = {"learning_rate": 3e-4, "max_new_tokens": 12, "max_prompt_tokens": 64, "num_episodes": 1,
                      "ppo_epochs": None, "inference_batch_size": 32, "inference_microbatch_size": 32,
                      "train_batch_size": 32, "train_minibatch_size": 32, "train_microbatch_size": 256, **_ENGINE}
# The embedded demos by task: the reward type's demo, or the tool demo under its --env.
EMBEDDED_DEMO_DEFAULTS = {"addition": DEMO_DEFAULTS, "code": CODE_DEMO_DEFAULTS, "multiply": TOOL_DEMO_DEFAULTS}

DESCRIPTION = ("Distributed RL post-training (GRPO, DAPO, PG, RLOO; PPO with a critic and a reward model) over Ray. "
               "With no arguments: the embedded demo (a tiny model learns 2-digit addition on the CPU in a few minutes, no downloads); with only -rt code: "
               "the code demo (a tiny model learns to write short stdin -> stdout programs, scored in the sandbox); "
               "with only --env tool_demo: the tool demo (a tiny model learns to call a multiply tool for 3-digit "
               "products; --env tool_demo_off is its control, whose tool always fails).")

PPO_DESCRIPTION = ("RLHF-PPO over Ray: coati train with -a PPO as the default. The policy (-m/--model) is trained on "
                   "-d/--dataset against a reward model's score (--reward-model DIR, a `coati rm` output) and/or the "
                   "-rt verifiable reward (--verifiable-reward-weight > 0), with a critic (--critic-model) and a KL "
                   "penalty to the initial policy. There is no demo without arguments: PPO needs one of those "
                   "scores (without -m/-d it trains the embedded addition model, e.g. --verifiable-reward-weight 1); "
                   "`coati rlhf --dummy` runs sft -> rm -> ppo on generated data.")


@dataclass(frozen=True)
class RLOptions(RLConfig):
    """The command line's tree: RLConfig's options and --grpo-config, which feeds several fields of the algorithm
    (a source, not a setting, so it stays out of the run's config)."""

    grpo_config: str | None = option(None, grpo_config_help(AlgoConfig), json_text=True)


dataclass_cli.options(RLOptions)  # a flag clash between two config fields fails here, at import


def build_parser(prog: str = "rl_example.py", description: str = DESCRIPTION, **defaults) -> argparse.ArgumentParser:
    """rl_example.py's parser; ``defaults`` replace fields' defaults (``coati ppo``: ``algo="PPO"``), below
    ``--config`` and the flags, and --help names them as the command's."""
    return dataclass_cli.build_parser(RLOptions, prog, description, defaults)


def config_from_args(args: argparse.Namespace, demo=None, given: set[str] | None = None) -> RLConfig:
    """``demo`` (DemoAssets) fills in the model and data when --model/--dataset are not given. ``given``: the
    dests the user set (the parser's ``given``), so an option of another algorithm is refused even at its
    default value."""
    return config_from_values(vars(args), demo, given)


def config_from_dict(mapping: dict, defaults: dict | None = None, demo=None, source: str = "config") -> RLConfig:
    """The RLConfig of ``mapping`` (keys as in ``--config`` YAML: ``learning_rate``, ``kl-reward-coef``, older
    names too; ``grpo_config`` and ``eval_dataset`` may be the object itself), with ``defaults`` (the command's,
    e.g. ``{"algo": "PPO"}``) below it, exactly as ``build_parser(**defaults)`` and the same flags would give.
    A bad key or value is one ConfigFileError line starting with ``source``."""
    load_user_plugins(plugins_of_mapping(mapping))  # first: a reward kind they register is an -rt choice
    values = dataclass_cli.defaults(RLOptions)
    values.update(dataclass_cli.check_values(RLOptions, defaults or {}, f"{source} defaults"))
    given = dataclass_cli.check_values(RLOptions, mapping, source)
    values.update(given)
    return config_from_values(values, demo, set(given))


def embedded_demo(reward_type: str, env: str | None) -> str:
    """The task of the embedded demo a run without -m plays (a key of ``EMBEDDED_DEMO_DEFAULTS``): the reward
    type's own demo, or the tool demo under its --env (which grades the answers itself)."""
    if env in TOOL_DEMO_ENVS:
        return "multiply"
    spec = REWARD_TYPES.get(reward_type)
    return (spec.embedded_demo if spec is not None else None) or "addition"


def _situation(values: dict, demo) -> tuple[bool, dict, dict, dict]:
    """(whether the embedded demo runs, the eval paths, the --grpo-config overrides, the situation's defaults):
    fills the model, data, system prompt and the defaults that depend on the situation into ``values`` (the batch
    sizes: ``_batches``)."""
    embedded = values["model"] is None
    if embedded and demo is None:
        raise ConfigError("no --model given and the embedded demo assets were not built")
    reward_type = values["reward_type"]
    spec = REWARD_TYPES.get(reward_type)  # an unknown name is validate's to refuse
    tool = embedded and values["env"] in TOOL_DEMO_ENVS
    if embedded and spec is not None and spec.embedded_demo is None:
        fits = " or -rt ".join(name for name, other in REWARD_TYPES.items() if other.embedded_demo)
        raise ConfigError(f"the embedded demo model answers in \\boxed{{}}: use -rt {fits}, "
                          "or pass -m/--model and -d/--dataset")
    if tool and spec is not None and spec.needs_sandbox:
        raise ConfigError(f"--env {values['env']} runs the tool demo, whose answers are graded by its environment: "
                          f"drop -rt {reward_type} (or pass -m/--model and -d/--dataset)")
    demo_task = embedded_demo(reward_type, values["env"])
    user_data = values["dataset"] is not None
    if embedded:
        values.update(model=demo.model_dir, dataset=values["dataset"] or demo.train_path)
    if values["dataset"] is None:
        raise ConfigError("-d/--dataset is required with -m/--model (a math or code jsonl)")
    eval_paths = parse_eval_datasets(values["eval_dataset"])
    if not eval_paths and embedded and not user_data:
        eval_paths = {demo_task: demo.eval_path}
    if values["system_prompt"] is None:  # a prompt template carries its own instructions
        values["system_prompt"] = "" if embedded or values["prompt_template"] is not None else \
            default_system_prompt(reward_type)
    if values["project"] is None:
        values["project"] = "demo" if embedded else run_name(values["model"])
    grpo_overrides = parse_grpo_config(values["grpo_config"])
    situation = EMBEDDED_DEMO_DEFAULTS[demo_task] if embedded else MODEL_DEFAULTS
    for key, default in situation.items():
        # an epochs count from --grpo-config beats the situation's, as an explicit flag does; the batch sizes
        # follow the given ones (_batches)
        if values[key] is None and key not in BATCHES and not (key == "ppo_epochs" and key in grpo_overrides):
            values[key] = default
    return embedded, eval_paths, grpo_overrides, situation


def _batches(values: dict, situation: dict) -> None:
    """The batch sizes not given follow the given ones (coati.config.batch_defaults); the engine's KV budget
    not given is the field's default, which the memory plan may lower (it was recorded as not given)."""
    values.update(follow_given(values, situation))
    if values["vllm_kv_cache_gb"] is None:
        values["vllm_kv_cache_gb"] = ParallelConfig.vllm_kv_cache_gb


def _colocation(values: dict, given: set[str]) -> None:
    """--colocate means no inferencer actors (-i 0; an explicit -i N is refused); -i or -t given without it
    means the decoupled layout, so the one-GPU default (launcher) leaves such a run alone."""
    if values["colocate"]:
        if "num_inferencer" in given and values["num_inferencer"] != 0:
            raise ConfigError(f"--colocate: the trainer ranks generate and there are no inferencer actors: drop "
                              f"-i {values['num_inferencer']} (or drop --colocate)")
        values["num_inferencer"] = 0
    elif values["colocate"] is None and given & {"num_inferencer", "num_trainers"}:
        values["colocate"] = False


def resumed_values(saved: dict, values: dict, given: set[str]) -> tuple[dict, list[str]]:
    """--resume: (the checkpoint's option values with the ones ``given`` again on top, the long flags given again
    with a different value as "FLAG OLD -> NEW"). ``--resume`` itself is always this run's."""
    flags = {opt.dest: opt.long for opt in dataclass_cli.options(RLOptions)}
    merged = {**values, **{dest: value for dest, value in saved.items() if dest in flags}}
    changed = []
    for dest in sorted(given):
        merged[dest] = values[dest]
        # where the checkpoint was found is not a change of the run
        if dest not in LOCATES_RUN and dest in saved and _plain(saved[dest]) != _plain(values[dest]):
            changed.append(f"{flags.get(dest, dest)} {_shown(saved[dest])} -> {_shown(values[dest])}")
    merged["resume"] = values["resume"]
    return merged, changed


LOCATES_RUN = ("resume", "save_dir", "project")


def _shown(value) -> str:
    return "default" if value is None else repr(value)


def _plain(value):
    return list(value) if isinstance(value, tuple) else value


def run_name(model: str) -> str:
    """A user's run is named after its model (a directory's last part, a hub name's model part), else ``run``."""
    return os.path.basename(os.path.normpath(model)) if model.strip("/. ") else "run"


def ship_parts(plugins) -> UserParts:
    """The run's UserParts: its --plugins and the rows the driver's own code registered (pickled by value for
    the actors); rows that cannot travel are one ConfigError line."""
    try:
        return UserParts(tuple(plugins)).shipping()
    except UserPartsError as err:
        raise ConfigError(str(err)) from None


def config_from_values(values: dict, demo=None, given: set[str] | None = None) -> RLConfig:
    """The checked RLConfig of option values by dest (flags, --config, defaults all applied); ``given``: the dests
    the user set, checked against the algorithm's options."""
    values = dict(values)
    options = {dest: values[dest] for dest in dataclass_cli.defaults(RLOptions)}
    load_user_plugins(values["plugins"] or ())  # already imported by the command's door: a no-op then
    embedded, eval_paths, grpo_overrides, situation = _situation(values, demo)
    _colocation(values, given or set())
    _batches(values, situation)
    max_new_tokens = values["max_new_tokens"]
    data = construct(DataConfig, values, eval_paths=eval_paths)
    stops = data.stop_strings(data.reward_type)
    flags = {key: values[knob.dest] for key, knob in grpo_keys(AlgoConfig).items() if knob.is_flag}
    # the parts built from their flags alone (parallel, batch, run) are constructed from the values directly
    config = construct(
        RLConfig, values,
        model=construct(ModelConfig, values, is_embedded_demo=embedded),
        data=data,
        sampling=construct(SamplingParams, values, n=values["num_generations"], stop_strings=stops),
        algo=build_algo_config(values["algo"], values["learning_rate"], values["max_grad_norm"], max_new_tokens,
                               grpo_overrides, ppo=construct(PPOConfig, values), **flags),
        eval_sampling=(
            ("sampled", SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens, stop_strings=stops)),
            ("greedy", SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens, stop_strings=stops)),
        ),
        options=options,
        parts=ship_parts(values["plugins"] or ()),
    )
    validate(config)
    if given:
        check_families(config, given)
    return config
