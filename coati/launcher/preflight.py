"""Checks before launch that open files or import engines: the model directory, every dataset (parsed in full),
the sandbox, -b vllm's package and GPUs, the model's shape against -tp/-pp, PPO's models and a resume checkpoint.

``coati.config`` checks what the flags alone decide; these need the disk or an engine, so they sit above the
rooms they ask (rollout's engines, the trainer's checkpoints) and run once, before any actor starts.
"""

from __future__ import annotations

import os

from coati.config.errors import ConfigError, require
from coati.config.ppo import PPOConfig
from coati.config.tree import RLConfig
from coati.dataset.jsonl import plain_text_line
from coati.registry import resolve
from rewards import reward_type
from rewards.types import example_label


# What stands for a path that is built later (the embedded demo's model and data) while the flags are checked.
PLACEHOLDER = "<demo>"


MODEL_OPTIONS = {"model": "-m/--model", "reward_model": "--reward-model", "critic_model": "--critic-model"}


def resolve_model_names(values: dict, log=print) -> dict:
    """Option values (by dest) with every hub name or GGUF file among the models (ORG/NAME, with --revision for
    -m; a .gguf file or directory, with --gguf-file for -m) replaced by its local HF directory: done once, before
    the config is built, so the policy, reference, reward model, critic, vLLM and actors on other nodes are all
    handed that directory."""
    from coati.utils.model_source import MODEL_SOURCE_ERRORS, local_model_dir, model_display_name

    values, given = dict(values), values.get("model")
    for dest, flag in MODEL_OPTIONS.items():
        if values.get(dest):
            first = dest == "model"
            try:
                values[dest] = local_model_dir(values[dest], values.get("revision") if first else None, flag,
                                               values.get("gguf_file") if first else None, log=log)
            except MODEL_SOURCE_ERRORS as err:
                raise ConfigError(str(err)) from None
    if given and values.get("project") is None and values["model"] != given:
        # named after what the user gave, not its snapshot's commit or its converted directory
        values["project"] = model_display_name(given)
    return values


def check_paths(config: RLConfig, models: bool = True) -> None:
    """Every data file (and with ``models`` every model directory) the options name exists: one line naming the
    flag, before the demo's assets or any model is built (check_inputs then reads them in full)."""
    d, ppo = config.data, config.algo.ppo
    named = [("-d/--dataset", d.train_path)]
    named += [(f"-ed/--eval-dataset task {name!r}", path) for name, path in d.eval_paths.items()]
    if models:
        named += [("-m/--model", config.model.path), ("--reward-model", ppo.reward_model),
                  ("--critic-model", ppo.critic_model)]
    if config.run.resume not in (None, "latest"):
        named.append(("--resume", config.run.resume))
    for flag, path in named:
        require(path in (None, PLACEHOLDER) or os.path.exists(path), f"{flag} not found: {path}")


def model_architectures(path: str) -> list[str]:
    """The ``architectures`` a model directory's config.json names ([] when it names none or cannot be read:
    check_inputs says what is wrong with the directory)."""
    import json

    try:
        with open(os.path.join(path, "config.json")) as handle:
            names = json.load(handle).get("architectures")
    except (OSError, ValueError, AttributeError):
        return []
    return [name for name in names if isinstance(name, str)] if isinstance(names, list) else []


def choose_engine(config: RLConfig) -> tuple[RLConfig, str | None]:
    """(the config with its engine, the start line that names it and why, or None): a user's model without -b
    runs on the fastest engine installed here that serves its architecture and the run (coati/config/engine.py);
    -b, the embedded demos and a config built in code keep theirs."""
    import dataclasses

    from coati.config.engine import choose_backend, engine_asks, engine_line
    from coati.config.validate import validate
    from coati.registry.backends import BACKENDS

    if config.model.is_embedded_demo or config.options.get("backend", config.parallel.backend) is not None:
        return config, None
    architectures = model_architectures(config.model.path)
    offers = {name: resolve(spec.offer)(architectures) for name, spec in BACKENDS.items() if spec.offer}
    name, why = choose_backend(architectures[0] if architectures else None, offers, engine_asks(config.parallel))
    chosen = dataclasses.replace(config, parallel=dataclasses.replace(config.parallel, backend=name))
    validate(chosen)
    return chosen, engine_line(name, why)


def check_engine(config: RLConfig) -> None:
    """The engine this machine would start (its backend's preflight), checked before any build or actor."""
    preflight = config.parallel.backend_spec.preflight
    if preflight is None:
        return
    from coati.cluster.connect import cluster_address

    # A joined cluster's GPUs are on its nodes, not necessarily here: cluster.reserve checks those.
    local = cluster_address(config.run.master_address)[0] is None
    resolve(preflight)(config.parallel.producer_tensor_parallel_size if local else 1)


def _check_model_layout(config: RLConfig) -> None:
    """tp/pp against the model's heads, MLP width and layers, and pipeline support for its family."""
    from transformers import AutoConfig

    from coati.plugins.validation import validate_model

    p = config.parallel
    if p.tensor_parallel_size == 1 and p.pipeline_parallel_size == 1:
        return
    try:
        validate_model(p.plugin_name, p.parallel_dims, AutoConfig.from_pretrained(config.model.path))
    except ValueError as err:
        raise ConfigError(f"{config.model.path}: {err}") from None


def _check_ppo_models(ppo: PPOConfig) -> None:
    """--reward-model is a reward model (a single-label score head), --critic-model an HF directory."""
    if ppo.reward_model is not None:
        from coati.rollout.reward_model import reward_model_problem

        problem = reward_model_problem(ppo.reward_model)
        require(problem is None, f"--reward-model: {problem}")
    require(ppo.critic_model is None or os.path.isfile(os.path.join(ppo.critic_model, "config.json")),
             f"--critic-model directory not found or without config.json: {ppo.critic_model} (pass a directory "
             "written by save_pretrained, e.g. runs/rlhf/rm/final)")


def _check_response(config: RLConfig, example) -> str:
    """A response in the reward type's format, answering with the row's own gold (a check call's input)."""
    return reward_type(config.data.reward_type).sample_response.format(answer=example_label(example))


def check_user_rewards(config: RLConfig, first) -> None:
    """--reward-fn: each function loads and, called on the first training row, returns a finite number (or
    (number, dict) with an optional "correct" bool); --reward-url: the server scores that row. DAPO's accuracy
    filter needs correctness, which that row must then have (rewards/correctness.py; a graded -rt kind gives none).
    One ConfigError line otherwise, before any actor."""
    d = config.data
    kind = reward_type(d.reward_type)
    if not d.reward_fn and d.reward_url is None and kind.verdict:
        return  # the built-in verdict, at weight 1: correctness is defined
    from rewards.combine import CombinedRewards, RewardWeightsError, last_user_text
    from rewards.correctness import sample_correct
    from rewards.remote import RemoteRewardError
    from rewards.user import RewardFnError

    options = d.scorer_options()
    try:
        rewards = CombinedRewards(d.reward_type, d.reward_fn, d.reward_url, d.reward_weights,
                                  options["remote_options"], options["correct_threshold"])
        answers = []
        if rewards.functions or rewards.remote is not None:
            response, label = _check_response(config, first), example_label(first)
            answers = [fn(response, label, first.row, f"{first.source} (the check call at start-up)")
                       for fn in rewards.functions]
            if rewards.remote is not None:
                answers += rewards.remote.score([{"prompt": last_user_text(first), "response": response,
                                                  "label": label}])
    except (RewardFnError, RemoteRewardError, RewardWeightsError) as err:
        raise ConfigError(str(err)) from None
    verdicts = [answer.correct for answer in answers if answer.correct is not None]
    defined = sample_correct(True if kind.verdict else None, rewards.weights[d.reward_type], verdicts, 0.0,
                             rewards.correct_threshold) is not None
    why = "weighs 0" if kind.verdict else "grades without a verdict"
    require(defined or config.algo.groups.filter_range is None,
            f"filter_range keeps groups by accuracy, but no reward of this run defines correctness ({d.reward_type} "
            f"{why}): return (score, {{\"correct\": bool}}) from --reward-fn, set --correct-threshold, or drop "
            "filter_range")


def check_inputs(config: RLConfig, engine: bool = True) -> tuple[str, ...]:
    """Checks that open files: the model directory and every dataset (parsed in full, line by line); with
    ``engine``, the inference engine this machine would start. Returns the lines to show as the run starts (and in
    --dry-run): what the rows' prompts become for a model without a chat template."""
    if engine:
        check_engine(config)
    from coati.dataset.loader import DatasetError, load_examples

    path = config.model.path
    require(not os.path.isfile(path), f"-m/--model {path} is a file: pass the directory that holds it and the "
                                      "model's config.json (written by save_pretrained)")
    require(os.path.isdir(path), f"model directory not found: {path} (pass -m/--model a local HF model directory "
                                 "or a hub name ORG/NAME)")
    require(os.path.isfile(os.path.join(path, "config.json")),
             f"{path} has no config.json: pass -m/--model a directory written by save_pretrained")
    if reward_type(config.data.reward_type).needs_sandbox:
        from rewards.code import SandboxUnavailable, check_sandbox_available

        try:
            check_sandbox_available()
        except SandboxUnavailable as err:
            raise ConfigError(str(err)) from None
    if config.episodes.env is not None:
        _check_env(config.episodes.env)
    try:
        train = load_examples(config.data.train_path, config.data.rows)
    except DatasetError as err:
        raise ConfigError(str(err)) from None
    if train:
        check_user_rewards(config, train[0])
    for name, eval_path in config.data.eval_paths.items():
        try:
            load_examples(eval_path, config.data.rows)
        except DatasetError as err:
            raise ConfigError(f"-ed/--eval-dataset task {name!r}: {err}") from None
    _check_model_layout(config)
    if config.algo.uses_critic:
        _check_ppo_models(config.algo.ppo)
    if config.run.resume is not None:
        from coati.launcher.checkpoints import check_resume

        try:
            check_resume(config, len(train))
        except ValueError as err:
            raise ConfigError(str(err)) from None
    chunk = config.algo.learner_chunk_size
    if chunk > 0:  # producers and learner split the data in proportion: it must hold one full round
        round_size = config.parallel.num_inferencers * config.batch.inference_batch_size + chunk
        require(len(train) >= round_size,
                 f"{config.data.train_path} has {len(train)} prompts: one round needs num_inferencer*ibs + "
                 f"--learner-chunk-size = {round_size}; lower -ibs or --learner-chunk-size, or add data")
    sources = config.parallel.rollout_sources
    generators = "trainer ranks (--colocate)" if config.parallel.colocate else "inferencers"
    require(len(train) // sources >= config.batch.inference_batch_size,
             f"{config.data.train_path} has {len(train)} prompts: each of the {sources} {generators} needs at "
             f"least -ibs={config.batch.inference_batch_size}; lower -ibs or add data")
    _check_positions(config)
    line = _prompt_format_line(config, train)
    return (line,) if line else ()


def _prompt_format_line(config: RLConfig, train) -> str | None:
    """A tokenizer without a chat template turns chat rows and a system prompt into plain text silently: say so,
    unless a --prompt-template says how the prompts look (or the directory holds no tokenizer to ask)."""
    if config.data.prompt_template is not None or chat_template_of(config.model.path) is not False:
        return None
    # a row of one user message is its text as it stands; a chat of several (or a system turn) loses its roles
    chat_rows = any(len(example.messages) > 1 for example in train)
    return plain_text_line(config.model.path, config.data.system_prompt, chat_rows)


def chat_template_of(model_dir: str) -> bool | None:
    """Whether the tokenizer saved in ``model_dir`` has a chat template (None: no tokenizer there), read from its
    files without loading it: transformers keeps the template in ``chat_template.jinja`` (or ``.json``) or in
    ``tokenizer_config.json``."""
    import json

    if any(os.path.isfile(os.path.join(model_dir, name)) for name in ("chat_template.jinja", "chat_template.json")):
        return True
    config = os.path.join(model_dir, "tokenizer_config.json")
    if not os.path.isfile(config):
        return None
    try:
        with open(config) as handle:
            return bool(json.load(handle).get("chat_template"))
    except (OSError, ValueError):
        return None


def _check_positions(config: RLConfig) -> None:
    """-mpt + -mnt within the model's positions (max_position_embeddings in its config.json, when it says)."""
    import json

    with open(os.path.join(config.model.path, "config.json")) as handle:
        positions = json.load(handle).get("max_position_embeddings")
    prompt, new = config.data.max_prompt_tokens, config.sampling.max_new_tokens
    require(not isinstance(positions, int) or prompt + new <= positions,
            f"-mpt {prompt} + -mnt {new} = {prompt + new} tokens exceed the model's {positions} positions "
            f"(max_position_embeddings in {config.model.path}/config.json): lower -mnt or -mpt")


def _check_env(spec: str) -> None:
    """--env: the file imports, the class exists and one instance can be made (its tools' schemas build)."""
    from coati.rollout.env import EnvLoadError, load_env, make_env
    from rewards.code import SandboxUnavailable

    try:
        make_env(load_env(spec))
    except (EnvLoadError, SandboxUnavailable) as err:
        raise ConfigError(str(err)) from None
