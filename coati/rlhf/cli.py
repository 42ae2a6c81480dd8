"""``coati sft`` and ``coati rm``: options (flags or ``--config stage.yaml``) -> checked inputs -> one stage.

Without -m/-d they run on the embedded addition task: ``coati sft`` fine-tunes the untrained tiny model on
generated demonstrations, ``coati rm`` trains a reward model from the demo's warm-started model on generated
preference pairs (the correct sum chosen over a wrong one). Every bad option, file or row stops the command
with one ``error:`` line before any training.
"""

from __future__ import annotations

import os
import shlex
import sys

from coati.config.errors import ConfigError
from coati.config.stage import RMConfig, SFTConfig, StageConfig, validate
from coati.utils.dataclass_cli import ConfigFileError, parse

DESCRIPTIONS = {
    "sft": "Supervised fine-tuning on {prompt, completion} rows: the loss is the completion tokens' negative "
           "log-likelihood (prompt tokens never count), trained through any trainer plugin layout; writes an "
           "HF causal LM to <save-dir>/<project>/final. No -m/-d: the embedded addition task.",
    "rm": "Reward model from {prompt, chosen, rejected} rows: the LM body with a scalar head "
          "(AutoModelForSequenceClassification, num_labels=1), Bradley-Terry loss -log sigmoid(r_chosen - "
          "r_rejected), pairwise accuracy on held-out pairs; writes the HF model to <save-dir>/<project>/final. "
          "No -m/-d: the embedded addition task's preferences, from the demo's warm-started model.",
}


def check_model_dir(path: str) -> None:
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise ConfigError(f"model directory not found or without config.json: {path} "
                          "(pass -m/--model a directory written by save_pretrained)")


def resolve_model_name(config: StageConfig, log=print) -> StageConfig:
    """-m given as a hub name ORG/NAME or a GGUF file: its local HF directory (coati/utils/model_source.py)."""
    from coati.utils.model_source import MODEL_SOURCE_ERRORS, with_local_models

    try:
        return with_local_models(config, {"model": "-m/--model"}, log=log)
    except MODEL_SOURCE_ERRORS as err:
        raise ConfigError(str(err)) from None


def check_given_inputs(config: StageConfig) -> None:
    """The model directory and every row of the files the options name, before the embedded model or data is
    built."""
    from coati.trainer.supervised import load_stage_rows
    from coati.launcher.stage_checkpoint import resume_point

    resume_point(config)
    if config.model is not None:
        check_model_dir(config.model)
    if config.dataset is not None:
        load_stage_rows(config, config.dataset, config.eval_dataset)
    elif config.eval_dataset is not None and not os.path.exists(config.eval_dataset):
        raise ConfigError(f"-ed/--eval-dataset not found: {config.eval_dataset}")


def resolve_inputs(config: StageConfig, log=print) -> tuple[str, str, str | None]:
    """(model directory, training file, held-out file or None); builds the embedded model / data when not given."""
    model_path = config.model
    if model_path is None:
        from coati.demo.math_demo import ensure_base_model, ensure_demo_assets

        model_path = ensure_base_model() if config.stage == "sft" else ensure_demo_assets(log=log).model_dir
    check_model_dir(model_path)
    train_path, eval_path = config.dataset, config.eval_dataset
    if train_path is None:
        from coati.rlhf.dummy import write_dummy_data

        paths = write_dummy_data(os.path.join(config.run_dir, "data"))
        name = "sft" if config.stage == "sft" else "preferences"
        train_path, eval_path = paths[name], eval_path or paths[f"{name}_eval"]
    return model_path, train_path, eval_path


def resume_command(prog: str, argv: list[str]) -> str:
    """The command that continues a stopped stage: its own options again (the stage keeps no copy of them until
    it ends), with ``--resume latest`` in place of any ``--resume``."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--resume":
            skip = True  # and its value
        elif not arg.startswith("--resume="):
            kept.append(arg)
    return shlex.join([*prog.split(), *kept, "--resume", "latest"])


def run(cls, argv: list[str] | None, prog: str) -> int:
    from coati.config.user_plugins import load_line_plugins
    from coati.trainer.supervised import load_stage_rows

    try:
        load_line_plugins(argv)  # first, as every command does (coati/config/user_plugins.py)
        config = resolve_model_name(parse(cls, argv, prog, DESCRIPTIONS[cls.stage]))
        validate(config)
        check_given_inputs(config)  # the user's model and rows, before the embedded ones are built
        model_path, train_path, eval_path = resolve_inputs(config)
        if config.dataset is None:
            load_stage_rows(config, train_path, eval_path)  # the generated rows, before any model is trained
    except (ConfigError, ConfigFileError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2

    from coati.launcher.stage import run_stage
    from coati.cluster.supervision import RunStopped
    from coati.launcher.stop import RunInterrupted

    try:
        result = run_stage(config, train_path, eval_path, model_path)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except RunInterrupted as stopped:  # SIGINT/SIGTERM: one line, 130/143
        given = argv if argv is not None else sys.argv[1:]
        print(stopped.line(resume=resume_command(prog, given)), file=sys.stderr)
        return stopped.exit_code
    except RunStopped as stopped:  # a rank stuck past its wait's bound: its one line
        print(f"error: {stopped}", file=sys.stderr)
        return 1
    losses = result.losses
    print(f"\n{config.stage}: {result.steps} steps in {result.wall_s:.0f} s; training loss {losses[0]:.4f} (first "
          f"step) -> {losses[-1]:.4f} (last)")
    for key in result.after:
        before = result.before.get(key)
        print(f"held-out {key.removeprefix('eval_')}: " + (f"{before:.4f} -> " if before is not None else "")
              + f"{result.after[key]:.4f}")
    print(f"model: {result.model_dir}\nmetrics: {result.metrics_path}")
    return 0


def sft_main(argv: list[str] | None = None, prog: str = "coati sft") -> int:
    return run(SFTConfig, argv, prog)


def rm_main(argv: list[str] | None = None, prog: str = "coati rm") -> int:
    return run(RMConfig, argv, prog)
