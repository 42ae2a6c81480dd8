"""``coati rlhf``: the three-stage RLHF pipeline, SFT -> reward model -> PPO, from one YAML file (or ``--dummy``).

The YAML file::

    save_dir: runs            # every stage writes under <save_dir>/<project>/<stage>/
    project: rlhf
    model: path/to/base       # the model the first stage starts from (default: the embedded tiny model, untrained)
    stages: [sft, rm, ppo]    # a subset runs those alone; a later stage then needs its inputs given
    sft: {dataset: sft.jsonl, eval_dataset: sft_eval.jsonl, epochs: 1, ...}        # `coati sft` options
    rm:  {dataset: pairs.jsonl, eval_dataset: pairs_eval.jsonl, ...}               # `coati rm` options
    ppo: {dataset: prompts.jsonl, eval_dataset: '{"math": "p.jsonl"}', ...}       # `coati ppo` options

Each stage's section holds exactly the options of the command that runs it alone (same names, same checks).
What links the stages is filled in unless the section sets it: the reward model starts from the SFT output,
PPO's policy is the SFT output and its reward model the RM output (the critic starts from the reward model), and
PPO's prompts get the system prompt SFT trained with (none unless set; not the -rt reward type's default).
Every stage's options are checked before the first one trains, so a typo in the PPO section stops the
pipeline within seconds, not after SFT.

``--dummy``: the quickstart on the embedded addition task (coati/rlhf/dummy.py writes the three data sets; the
correct sum is the preferred answer), with settings sized for 2 CPU cores (``DUMMY`` below).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import sys
import time
from dataclasses import dataclass, field

STAGES = ("sft", "rm", "ppo")
TOP_KEYS = ("save_dir", "project", "model", "stages", *STAGES)

# The quickstart's settings, chosen for the tiny model on 2 CPU cores (measured numbers and time:
# docs/results.md, RLHF quickstart).
DUMMY = {
    # the embedded model's stage learning rates (rlhf/config.py DEMO_LR): each later stage starts from a given
    # model, whose default would be the small learning rate meant for real models
    "sft": {"epochs": 4, "batch_size": 32, "micro_batch_size": 32, "learning_rate": 1e-3},
    "rm": {"epochs": 4, "batch_size": 32, "micro_batch_size": 32, "learning_rate": 5e-4},
    "ppo": {"num_generations": 4, "inference_batch_size": 32, "inference_microbatch_size": 32,
            "train_batch_size": 16, "train_minibatch_size": 16, "train_microbatch_size": 64, "num_episodes": 1,
            "max_new_tokens": 16, "ppo_epochs": 2, "learning_rate": 1e-4, "critic_learning_rate": 3e-4,
            "kl_reward_coef": 0.3, "reward_type": "boxed"},
}


class PipelineError(ValueError):
    """A bad pipeline file or stage section; one line naming the key and the fix."""


@dataclass
class Plan:
    save_dir: str = "runs"
    project: str = "rlhf"
    model: str | None = None
    stages: tuple[str, ...] = STAGES
    sections: dict = field(default_factory=dict)  # stage -> its options as given
    resume: bool = False  # skip the stages whose model is written, continue the one that stopped

    def stage_dir(self, stage: str) -> str:
        return os.path.join(self.save_dir, self.project, stage)

    def done(self, stage: str) -> bool:
        """Whether a supervised stage finished: its final model and the stage_config.json written after it."""
        return all(os.path.isfile(os.path.join(self.stage_dir(stage), *name))
                   for name in (("final", "config.json"), ("stage_config.json",)))

    def stopped_in(self, stage: str) -> bool:
        """Whether a stage left a checkpoint to continue from."""
        from coati.utils.checkpoint import list_checkpoints

        return bool(list_checkpoints(self.stage_dir(stage)))

    def output(self, stage: str) -> str:
        """The model a stage leaves: SFT and RM their ``final``, PPO its last ``step_N`` (resolved after the run)."""
        return os.path.join(self.stage_dir(stage), "final")


def read_plan(path: str) -> Plan:
    import yaml

    if not os.path.isfile(path):
        raise PipelineError(f"--config file not found: {path}")
    try:
        with open(path, encoding="utf-8") as handle:
            raw = yaml.safe_load(handle) or {}
    except yaml.YAMLError as err:
        raise PipelineError(f"--config {path} is not valid YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(raw, dict):
        raise PipelineError(f"--config {path} must be a mapping with keys {', '.join(TOP_KEYS)}")
    unknown = sorted(set(raw) - set(TOP_KEYS))
    if unknown:
        from coati.utils.dataclass_cli import did_you_mean

        raise PipelineError(f"--config {path} has unknown key {unknown[0]!r}{did_you_mean(str(unknown[0]), TOP_KEYS)}; "
                            f"valid keys: {', '.join(TOP_KEYS)}")
    stages = tuple(raw.get("stages") or STAGES)
    bad = [s for s in stages if s not in STAGES]
    if bad or list(stages) != sorted(stages, key=STAGES.index):
        raise PipelineError(f"--config {path} stages must be an ordered subset of {list(STAGES)}, got {list(stages)}")
    sections = {}
    for stage in STAGES:
        section = raw.get(stage) or {}
        if not isinstance(section, dict):
            raise PipelineError(f"--config {path} section {stage!r} must be a mapping of option: value")
        sections[stage] = {str(k).replace("-", "_"): v for k, v in section.items()}
    return Plan(save_dir=str(raw.get("save_dir", "runs")), project=str(raw.get("project", "rlhf")),
                model=_local_model(path, "model", raw.get("model")), stages=stages,
                sections={stage: {key: _local_model(path, f"{stage}.{key}", value) if key in MODEL_KEYS else value
                                  for key, value in section.items()} for stage, section in sections.items()})


MODEL_KEYS = ("model", "reward_model", "critic_model")


def _local_model(path: str, key: str, name):
    """A model the YAML names as a hub name ORG/NAME or a GGUF file: its local HF directory
    (coati/utils/model_source.py), resolved once, before any stage starts."""
    from coati.utils.model_source import MODEL_SOURCE_ERRORS, local_model_dir

    if not isinstance(name, str) or not name:
        return name
    try:
        return local_model_dir(name, flag=f"--config {path} {key}:")
    except MODEL_SOURCE_ERRORS as err:
        raise PipelineError(str(err)) from None


def dummy_plan(save_dir: str, project: str) -> Plan:
    from coati.rlhf.dummy import write_dummy_data

    data = write_dummy_data(os.path.join(save_dir, project, "data"))
    sections = {
        "sft": {**DUMMY["sft"], "dataset": data["sft"], "eval_dataset": data["sft_eval"]},
        "rm": {**DUMMY["rm"], "dataset": data["preferences"], "eval_dataset": data["preferences_eval"]},
        "ppo": {**DUMMY["ppo"], "dataset": data["prompts"],
                "eval_dataset": json.dumps({"addition": data["prompts_eval"]})},
    }
    return Plan(save_dir=save_dir, project=project, sections=sections)


def stage_config(plan: Plan, stage: str):
    """The checked options of a supervised stage, with the links to the previous stage filled in."""
    from coati.config.stage import RMConfig, SFTConfig, validate

    from coati.utils.dataclass_cli import ConfigFileError, check_values, construct, defaults, key_index, unknown_key_hint

    cls = SFTConfig if stage == "sft" else RMConfig
    values = dict(plan.sections[stage])
    unknown = sorted(set(values) - set(key_index(cls)))
    if unknown:
        raise PipelineError(f"section {stage!r} has unknown option {unknown[0]!r}{unknown_key_hint(cls, unknown[0])} "
                            f"(see `coati {stage} --help`)")
    try:
        values = check_values(cls, values, f"section {stage!r}")
    except ConfigFileError as err:
        raise PipelineError(str(err)) from None
    # the top-level model: starts whichever supervised stage comes first
    values.setdefault("model", plan.output("sft") if stage == "rm" and "sft" in plan.stages else plan.model)
    values.setdefault("save_dir", os.path.join(plan.save_dir, plan.project))
    values.setdefault("project", stage)
    config = construct(cls, {**defaults(cls), **values})
    validate(config)
    return config


def ppo_values(plan: Plan) -> dict:
    """The PPO section's options (`coati ppo`'s keys) with the links to the earlier stages filled in."""
    values = dict(plan.sections["ppo"])
    if "sft" in plan.stages:
        values.setdefault("model", plan.output("sft"))
    elif plan.model is not None:
        values.setdefault("model", plan.model)
    if "rm" in plan.stages:
        values.setdefault("reward_model", plan.output("rm"))
    # the policy and the reward model learnt their prompts with the SFT/RM system prompt: PPO's must be the same
    supervised = {**plan.sections["rm"], **plan.sections["sft"]}
    values.setdefault("system_prompt", supervised.get("system_prompt", ""))
    values.setdefault("save_dir", os.path.join(plan.save_dir, plan.project))
    values.setdefault("project", "ppo")
    if plan.resume and plan.stopped_in("ppo"):
        values.setdefault("resume", "latest")
    return values


def ppo_config(plan: Plan, check_files: bool):
    """The checked RLConfig of the PPO section: `coati ppo` with these options (``-a PPO`` below them)."""
    from coati.config.cli import RLOptions, config_from_dict
    from coati.config.errors import ConfigError
    from coati.launcher.preflight import check_inputs
    from coati.utils.dataclass_cli import ConfigFileError, key_index, unknown_key_hint

    values = ppo_values(plan)
    known = key_index(RLOptions)
    for key in values:
        if key not in known:
            raise PipelineError(f"section 'ppo' has option {key!r}, which `coati ppo` does not take"
                                f"{unknown_key_hint(RLOptions, key)} (see `coati ppo --help`)")
    if values.get("model") is None:
        raise PipelineError("section 'ppo' needs model: (the policy to train) when the pipeline has no sft stage")
    try:
        config = config_from_dict(values, defaults={"algo": "PPO"}, source="section 'ppo'")
        if check_files:  # the models an earlier stage writes are not there before it ran
            check_inputs(config)
    except ConfigFileError as err:
        raise PipelineError(str(err)) from None
    except ConfigError as err:
        raise PipelineError(f"section 'ppo': {err}") from None
    return config


@dataclass
class PipelineResult:
    sft: object = None  # StageResult
    rm: object = None
    ppo: object = None  # launch.RunResult
    ppo_eval: dict = field(default_factory=dict)  # "task/mode" -> {"before": {...}, "after": {...}}
    ppo_train: list = field(default_factory=list)  # the PPO run's training rows
    wall_s: float = 0.0


def run_pipeline(plan: Plan, log=print) -> PipelineResult:
    """Check every stage, then run them in order."""
    from coati.rlhf.cli import check_model_dir, resolve_inputs
    from coati.launcher.stage import run_stage
    from coati.trainer.supervised import load_stage_rows

    start = time.time()
    if plan.model is not None:  # the first stage's model, before any stage trains
        check_model_dir(plan.model)
    configs = {stage: stage_config(plan, stage) for stage in ("sft", "rm") if stage in plan.stages}
    for stage, config in configs.items():  # rows are checked now; a model made by an earlier stage is not there yet
        if config.dataset is None:
            raise PipelineError(f"section {stage!r} needs dataset: (or run `coati rlhf --dummy`)")
        load_stage_rows(config, config.dataset, config.eval_dataset)
    if "ppo" in plan.stages:  # its data files now; the models the earlier stages write are not there yet
        from coati.config.errors import ConfigError
        from coati.launcher.preflight import check_paths

        try:
            check_paths(ppo_config(plan, check_files=False), models=False)
        except ConfigError as err:
            raise PipelineError(f"section 'ppo': {err}") from None
    result = PipelineResult()
    for stage in ("sft", "rm"):
        if stage not in plan.stages:
            continue
        if plan.resume and plan.done(stage):
            log(f"== {stage}: done ({plan.output(stage)}); delete {plan.stage_dir(stage)} to train it again")
            continue
        log(f"== {stage}")
        config = configs[stage]
        if plan.resume and plan.stopped_in(stage):
            config = dataclasses.replace(config, resume="latest")
        model_path, train_path, eval_path = resolve_inputs(config, log=log)
        setattr(result, stage, run_stage(config, train_path, eval_path, model_path, log=log))
    if "ppo" in plan.stages:
        from coati.launcher.rl import run

        log("== ppo")
        config = ppo_config(plan, check_files=True)
        result.ppo = run(config, log=log)
        result.ppo_eval, result.ppo_train = eval_summary(config)
    result.wall_s = time.time() - start
    return result


def eval_summary(config) -> tuple[dict, list]:
    """('task/mode' -> {'before': row, 'after': row} of the PPO run's first and last eval rows, its train rows)."""
    rows: dict[str, dict] = {}
    train = []
    with open(os.path.join(config.run.run_dir, "metrics.jsonl"), encoding="utf-8") as handle:
        for line in handle:
            row = json.loads(line)
            if row.get("kind") == "eval":
                entry = rows.setdefault(f"{row['task']}/{row['mode']}", {})
                entry.setdefault("before", row)
                entry["after"] = row
            elif row.get("kind") == "train":
                train.append(row)
    return rows, train


def report(result: PipelineResult) -> list[str]:
    lines = []
    if result.sft is not None:
        lines.append(f"sft: {result.sft.steps} steps, training loss {result.sft.losses[0]:.3f} -> "
                     f"{result.sft.losses[-1]:.3f}; held-out loss {result.sft.before.get('eval_loss', float('nan')):.3f}"
                     f" -> {result.sft.after.get('eval_loss', float('nan')):.3f} ({result.sft.wall_s:.0f} s)")
    if result.rm is not None:
        lines.append(f"rm: {result.rm.steps} steps, held-out pairwise accuracy "
                     f"{result.rm.before.get('eval_accuracy', float('nan')):.3f} -> "
                     f"{result.rm.after.get('eval_accuracy', float('nan')):.3f} ({result.rm.wall_s:.0f} s)")
    if result.ppo is not None:
        lines.append(f"ppo: {result.ppo.steps} steps ({result.ppo.wall_s:.0f} s); model {result.ppo.final_model_dir}")
        tail = result.ppo_train[-16:]
        if tail and "kl" in tail[0]:
            def mean(name: str) -> float:
                return sum(r[name] for r in tail) / len(tail)

            lines.append(f"  last {len(tail)} steps: KL to the SFT policy {mean('kl'):.3f} per token, "
                         f"{mean('kl_seq'):.2f} per response (beta {tail[-1]['kl_coef']:.3g}); rollouts' "
                         f"reward-model score {result.ppo_train[0]['rm_score']:.3f} (first step) -> "
                         f"{mean('rm_score'):.3f}; critic's explained variance {mean('explained_variance'):.2f}")
        for key, entry in result.ppo_eval.items():
            before, after = entry["before"], entry["after"]
            text = f"  held-out {key}: accuracy {before['accuracy']:.3f} -> {after['accuracy']:.3f}"
            if "rm_score" in before:
                text += f", mean reward-model score {before['rm_score']:.3f} -> {after['rm_score']:.3f}"
            lines.append(text)
    lines.append(f"pipeline: {result.wall_s:.0f} s")
    return lines


def main(argv: list[str] | None = None, prog: str = "coati rlhf") -> int:
    from coati.config.errors import ConfigError
    from coati.utils.dataclass_cli import ConfigFileError
    from coati.utils.flag_parser import UNDERSCORES_NOTE, FlagParser

    parser = FlagParser(prog=prog, description=f"{__doc__}\n{UNDERSCORES_NOTE}",
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", metavar="FILE.yaml", help="the pipeline file (see above)")
    source.add_argument("--dummy", action="store_true",
                        help="the quickstart: generated addition data, the embedded tiny model, all three stages")
    parser.add_argument("-sd", "--save-dir", default="runs", help="--dummy: outputs under <save-dir>/<project>/")
    parser.add_argument("-p", "--project", default="rlhf", help="--dummy: the pipeline's name")
    parser.add_argument("--resume", action="store_true",
                        help="continue a stopped pipeline: stages whose model is written are skipped, the stage that "
                             "stopped continues from its newest checkpoint (-si)")
    args = parser.parse_args(argv)
    from coati.cluster.supervision import RunStopped  # imports Ray: not for --help
    from coati.launcher.stop import RunInterrupted

    try:
        plan = read_plan(args.config) if args.config else dummy_plan(args.save_dir, args.project)
        plan.resume = args.resume
        result = run_pipeline(plan)
    except (PipelineError, ConfigError, ConfigFileError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except RunInterrupted as stopped:  # the PPO stage, stopped by SIGINT/SIGTERM (with its checkpoint)
        again = [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--resume"]
        print(stopped.line(resume=shlex.join([*prog.split(), *again, "--resume"])), file=sys.stderr)
        return stopped.exit_code
    except RunStopped as stopped:  # a stage's rank stuck past its wait's bound, or a dead one: its one line
        print(f"error: {stopped}", file=sys.stderr)
        return 1
    print("\n" + "\n".join(report(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
