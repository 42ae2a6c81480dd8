"""Command-line flags (ColossalChat's names, long and short) -> a validated RLConfig.

Every flag is the ``option()`` metadata of the RLConfig field it sets (coati/utils/dataclass_cli.py makes the
flags, ``--config FILE.yaml`` and the YAML keys from it), so a new knob is one field. What stays here is what
one field cannot say: defaults that depend on the situation (the embedded demo, the code demo, a user's model)
and the -a preset < --grpo-config < dedicated flags precedence of the algorithm's fields.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from coati.algorithm.advantage import adv_estimator_names
from coati.algorithm.loss import POLICY_LOSSES
from coati.config.ppo import PPOConfig
from coati.config.rl import (
    GRPO_CONFIG_KEYS,
    ConfigError,
    DataConfig,
    ModelConfig,
    RLConfig,
    build_algo_config,
    parse_eval_datasets,
    parse_grpo_config,
    validate,
)
from coati.config.sampling import SamplingParams
from coati.utils import dataclass_cli
from coati.utils.dataclass_cli import construct, option
from rewards import STOP_STRINGS, default_system_prompt

# Defaults that differ between the embedded demo (no --model) and a user's model, for the flags declared
# with option(..., resolved=True) whose help names them.
_BATCHES = {"inference_batch_size": 64, "inference_microbatch_size": 64, "train_batch_size": 32,
            "train_minibatch_size": 32, "train_microbatch_size": 256}
DEMO_DEFAULTS = {"learning_rate": 3e-4, "max_new_tokens": 8, "max_prompt_tokens": 64, "num_episodes": 3,
                 "ppo_epochs": None, **_BATCHES}
MODEL_DEFAULTS = {"learning_rate": 1e-6, "max_new_tokens": 1024, "max_prompt_tokens": 512, "num_episodes": 1,
                  "ppo_epochs": None, **_BATCHES}
# -rt code without a model: the code demo (coati/demo/code_demo.py). Every sample runs in the sandbox, so
# samples are dear: small rounds and 4 passes over each batch get the most out of the ~3,000 it draws.
CODE_DEMO_DEFAULTS = {"learning_rate": 3e-4, "max_new_tokens": 16, "max_prompt_tokens": 64, "num_episodes": 2,
                      "ppo_epochs": 4, "inference_batch_size": 16, "inference_microbatch_size": 16,
                      "train_batch_size": 8, "train_minibatch_size": 8, "train_microbatch_size": 64}

GRPO_CONFIG_HELP = (
    "overrides of the -a preset: a JSON object or the path of a .json/.yaml file, e.g. "
    "'{\"clip_eps_high\": 0.28, \"filter_range\": [0.1, 0.9]}'. Keys: " + ", ".join(GRPO_CONFIG_KEYS) + ". "
    "beta is the KL weight; objective " + "|".join(POLICY_LOSSES) + "; advantage "
    + "|".join(adv_estimator_names("group")) + "; skip_threshold null "
    "turns it off; max_draw_multiple bounds dynamic batching to that many times -tbs groups drawn per step. "
    "Precedence: preset < --grpo-config < dedicated flags (-kl, --ppo-epochs, --topk-samples)"
)
DESCRIPTION = ("Distributed RL post-training (GRPO, DAPO, PG; PPO with a critic and a reward model) over Ray. "
               "With no arguments: the embedded demo (a tiny model learns 2-digit addition on the CPU in a few minutes, no downloads); with only -rt code: "
               "the code demo (a tiny model learns to write short stdin -> stdout programs, scored in the sandbox).")


@dataclass(frozen=True)
class RLOptions(RLConfig):
    """The command line's tree: RLConfig's options and --grpo-config, which feeds several fields of the algorithm
    (a source, not a setting, so it stays out of the run's config)."""

    grpo_config: str | None = option(None, GRPO_CONFIG_HELP)


dataclass_cli.options(RLOptions)  # a flag clash between two config fields fails here, at import


def build_parser(prog: str = "rl_example.py", **defaults) -> argparse.ArgumentParser:
    """rl_example.py's parser; ``defaults`` replace fields' defaults (``coati ppo``: ``algo="PPO"``), below
    ``--config`` and the flags."""
    parser = dataclass_cli.build_parser(RLOptions, prog, DESCRIPTION)
    parser.set_defaults(**defaults)
    return parser


def config_from_args(args: argparse.Namespace, demo=None) -> RLConfig:
    """``demo`` (DemoAssets) fills in the model and data when --model/--dataset are not given."""
    values = dict(vars(args))
    embedded = values["model"] is None
    if embedded and demo is None:
        raise ConfigError("no --model given and the embedded demo assets were not built")
    reward_type = values["reward_type"]
    code = reward_type == "code"
    if embedded and reward_type == "think_answer_tags":
        raise ConfigError("the embedded demo model answers in \\boxed{}: use -rt boxed (or -rt code), "
                          "or pass -m/--model and -d/--dataset")
    user_data = values["dataset"] is not None
    if embedded:
        values.update(model=demo.model_dir, dataset=values["dataset"] or demo.train_path)
    if values["dataset"] is None:
        raise ConfigError("-d/--dataset is required with -m/--model (a math or code jsonl)")
    eval_paths = parse_eval_datasets(values["eval_dataset"])
    if not eval_paths and embedded and not user_data:
        eval_paths = {"code" if code else "addition": demo.eval_path}
    if values["system_prompt"] is None:
        values["system_prompt"] = "" if embedded else default_system_prompt(reward_type)
    grpo_overrides = parse_grpo_config(values["grpo_config"])
    situation = (CODE_DEMO_DEFAULTS if code else DEMO_DEFAULTS) if embedded else MODEL_DEFAULTS
    for key, default in situation.items():
        # an epochs count from --grpo-config beats the situation's, as an explicit flag does
        if values[key] is None and not (key == "ppo_epochs" and key in grpo_overrides):
            values[key] = default

    max_new_tokens, stops = values["max_new_tokens"], STOP_STRINGS[reward_type]
    # the parts built from their flags alone (parallel, batch, run) are constructed from the values directly
    config = construct(
        RLConfig, values,
        model=construct(ModelConfig, values, is_embedded_demo=embedded),
        data=construct(DataConfig, values, eval_paths=eval_paths),
        sampling=construct(SamplingParams, values, n=values["num_generations"], stop_strings=stops),
        algo=build_algo_config(values["algo"], values["learning_rate"], values["max_grad_norm"], max_new_tokens,
                               grpo_overrides, kl_coeff=values["kl_coeff"], ppo_epochs=values["ppo_epochs"],
                               topk_samples=values["topk_samples"], learner_chunk_size=values["learner_chunk_size"],
                               correction=values["off_policy_correction"], tis_cap=values["tis_cap"],
                               ppo=construct(PPOConfig, values)),
        eval_sampling=(
            ("sampled", SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens, stop_strings=stops)),
            ("greedy", SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens, stop_strings=stops)),
        ),
    )
    validate(config)
    return config
