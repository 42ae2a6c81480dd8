"""``coati train`` / ``python rl_example.py``: flags -> a checked config -> a run over Ray.

With no arguments it runs the embedded demo: a tiny Qwen2 (built and warm-started locally, cached) learns
2-digit addition with GRPO, and held-out accuracy is printed before and after. ``-rt code`` alone runs the
code demo (coati/demo/code_demo.py): a second tiny model learns to write short stdin -> stdout programs,
scored in the sandbox. ``--env tool_demo`` alone runs the tool demo (coati/demo/tool_demo.py): a third tiny model
learns to call a multiply tool; ``--env tool_demo_off`` is its control, with a tool that always fails.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None, prog: str = "rl_example.py", description: str | None = None,
         **defaults) -> int:
    """``description``: this command's --help text (default: coati train's); ``defaults``: fields' defaults this
    command changes (``coati ppo``), below --config and the flags."""
    from coati.config.cli import DESCRIPTION, config_from_args
    from coati.config.errors import ConfigError
    from coati.launcher.preflight import check_engine, check_inputs, check_paths, choose_engine, resolve_model_names
    from coati.utils.dataclass_cli import ConfigFileError

    try:
        parser = command_parser(argv, prog, description or DESCRIPTION, defaults)
        args = parser.parse_args(argv)
    except (ConfigFileError, ConfigError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    dry_run, dry_run_cluster = command_flags(args)
    unreachable = probe_cluster(args.master_address, args.ray_dir) if dry_run and not dry_run_cluster else None
    if unreachable:
        print(f"error: {unreachable}", file=sys.stderr)
        return 1
    demo = None
    try:
        vars(args).update(resolve_model_names(vars(args)))
        if args.resume is not None:
            restore_options(args, parser.given)
        if args.model is None:
            # reject bad flags, missing files and a missing engine before building anything
            placeholder = config_from_args(args, demo=placeholder_demo(), given=parser.given)
            check_paths(placeholder)
            check_engine(placeholder)
            demo = ensure_demo(args.reward_type, args.env)
        config, engine = choose_engine(config_from_args(args, demo, given=parser.given))
        if dry_run or dry_run_cluster:
            # a described cluster's engines are not this machine's: its vLLM is not asked for here
            lines = check_inputs(config, engine=not dry_run_cluster)
            return print_plan(config, dry_run_cluster, (engine, *lines) if engine else lines)
        lines = check_inputs(config)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2

    from coati.cluster.connect import ClusterError
    from coati.cluster.supervision import RunStopped
    from coati.launcher.checkpoints import NothingToResume
    from coati.launcher.plan import PlanError
    from coati.launcher.rl import run
    from coati.launcher.stop import RunInterrupted
    from coati.rollout.evaluation import held_out_line

    try:
        result = run(config, start_lines=(engine, *lines) if engine else lines)
    except RunInterrupted as stopped:  # SIGINT/SIGTERM: one line, 130/143
        print(stopped.line(prog), file=sys.stderr)
        return stopped.exit_code
    except (ClusterError, RunStopped, PlanError, NothingToResume) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print()
    print(f"trained {result.steps} steps in {result.wall_s:.0f} s; final model: {result.final_model_dir}"
          + (" (a LoRA adapter; a full model: coati export --merge DIR OUT)" if config.model.lora.enabled else ""))
    print(f"metrics: {result.metrics_path}")
    for key in result.eval_after:
        before = {"accuracy": result.eval_before.get(key), "mean_reward": result.reward_before.get(key)}
        after = {"accuracy": result.eval_after[key], "mean_reward": result.reward_after.get(key)}
        print(held_out_line(key, before, after))
    print_tool_use(result.metrics_path, result.steps)
    return 0


def command_parser(argv: list[str] | None, prog: str, description: str, defaults: dict):
    """The command's whole parser: the config's flags (with ``--demo``'s defaults when the arguments ask for it,
    and the command's ``defaults`` above them), --dry-run's and --demo. The line's plugins (--plugins, and its
    --config file's plugins:) are imported first: a reward kind they register is an -rt choice."""
    from coati.config.cli import build_parser
    from coati.config.user_plugins import load_line_plugins

    load_line_plugins(argv)

    parser = build_parser(prog, description, **{**real_model_demo_defaults(argv), **defaults})
    add_dry_run_flags(parser)
    add_demo_flag(parser)
    return parser


def command_flags(args) -> tuple[bool, str | None]:
    """(--dry-run, --dry-run-cluster), taken out of ``args`` with --demo (already applied as defaults), so that
    what is left are the config's options."""
    args.__dict__.pop("demo")
    return args.__dict__.pop("dry_run"), args.__dict__.pop("dry_run_cluster")


def probe_cluster(master_address: str | None, ray_dir: str | None) -> str | None:
    """--dry-run against a running cluster: its head is asked before any other check, so a wrong address is one
    line in seconds; the line, or None (no cluster to join, or it answers)."""
    from coati.cluster.connect import ClusterError, cluster_address, probe

    try:
        address, source = cluster_address(master_address)
    except ValueError:
        return None  # the flag's own check names the problem
    if address is None or address == "auto" or "://" in address:
        return None
    try:
        probe(address, source, ray_dir)
    except ClusterError as err:
        return str(err)
    return None


def restore_options(args, given: set[str]) -> None:
    """--resume: the checkpoint's saved options below the flags given again, which one line lists; a different
    -m is refused (the checkpoint's weights are of its model)."""
    import os

    from coati.config.cli import resumed_values, run_name
    from coati.config.errors import ConfigError
    from coati.launcher.checkpoints import read_run_state
    from coati.utils.checkpoint import resolve_resume

    if args.resume != "latest" and not os.path.exists(args.resume):
        return  # check_paths names the flag
    project = args.project or ("demo" if args.model is None else run_name(args.model))
    try:
        path = resolve_resume(args.resume, os.path.join(args.save_dir, project))
    except FileNotFoundError as err:
        raise ConfigError(str(err)) from None
    try:
        saved = read_run_state(path).get("options")
    except (OSError, ValueError):
        return  # check_resume says what is wrong with the checkpoint
    if not saved:
        return
    if "model" in given and not _same_model(saved.get("model"), args.model):
        raise ConfigError(f"--resume {path}: it trained {saved.get('model') or 'the embedded demo model'}; "
                          f"-m {args.model} cannot continue it: drop -m, or drop --resume to start a new run")
    values, changed = resumed_values(saved, vars(args), given)
    vars(args).update(values)
    print(f"--resume {path}: the run's saved options" + (f"; given again: {', '.join(changed)}" if changed else ""))


def _same_model(saved: str | None, given: str | None) -> bool:
    import os

    return (saved is None) == (given is None) and (saved is None or os.path.normpath(saved) == os.path.normpath(given))


def print_tool_use(metrics_path: str, last_step: int) -> None:
    """With --env: the held-out tool-use rate before and after, from the run's eval rows."""
    import json

    rates: dict[str, dict[int, float]] = {}
    with open(metrics_path) as handle:
        for row in map(json.loads, handle):
            if row.get("kind") == "eval" and "tool_use_rate" in row:
                rates.setdefault(f"{row['task']}/{row['mode']}", {})[row["step"]] = row["tool_use_rate"]
    for key, by_step in rates.items():
        if 0 in by_step and last_step in by_step:
            before, after = by_step[0], by_step[last_step]
            print(f"held-out tool-use rate {key}: {before:.3f} -> {after:.3f} ({100 * (after - before):+.1f} points)")


def add_dry_run_flags(parser) -> None:
    group = parser.add_argument_group("plan")
    group.add_argument("--dry-run", action="store_true",
                       help="check every input a start checks (files, keys, reward functions, --resume, the model), "
                            "then print where every actor would go, its threads and its memory estimate, and whether "
                            "it fits, and exit without starting any actor")
    group.add_argument("--dry-run-cluster", metavar="NODESxGPUSxGB[xCPUS]",
                       help="--dry-run on a described cluster instead of the running one or this machine, e.g. "
                            "4x8x80 (4 nodes x 8 GPUs of 80 GB) or 1x0x24x2 (one CPU node, 24 GB RAM, 2 cores)")


def add_demo_flag(parser) -> None:
    from coati.demo.real_model import real_model_demos

    demos = real_model_demos()
    parser.add_argument("--demo", choices=tuple(demos), default=None,
                        help="; ".join(demo.summary for demo in demos.values())
                        + ". Held-out reward before and after; a demo's settings are defaults, every flag still applies")


def real_model_demo_defaults(argv: list[str] | None) -> dict:
    """The option defaults of ``--demo NAME`` when the arguments ask for it (its task's rows written once into the
    cache), else none; looked for before the parser is built, because they become the parser's defaults."""
    import argparse

    from coati.config.errors import ConfigError
    from coati.demo.real_model import real_model_demos

    finder = argparse.ArgumentParser(add_help=False)
    finder.add_argument("--demo", default=None)
    demo = real_model_demos().get(finder.parse_known_args(sys.argv[1:] if argv is None else argv)[0].demo)
    if demo is None:
        return {}  # none, or a name the real parser refuses with the choices
    try:
        return demo.defaults()
    except FileNotFoundError as err:
        raise ConfigError(str(err)) from None


def print_plan(config, cluster: str | None, start_lines: tuple[str, ...] = ()) -> int:
    """``--dry-run``: the plan's lines (after ``start_lines``, those the run would show as it starts: the default
    engine chosen, what the prompts become); 1 with the one error line when it cannot fit or the cluster cannot be
    joined, 2 for bad input."""
    from coati.cluster.connect import ClusterError
    from coati.launcher.plan import PlanError, dry_run

    try:
        lines, error = dry_run(config, cluster)
    except PlanError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except ClusterError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print("\n".join([*start_lines, *lines]))
    if error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


def ppo_main(argv: list[str] | None = None, prog: str = "coati ppo") -> int:
    """``coati ppo``: ``coati train`` with ``-a PPO`` as the default algorithm (``--config ppo.yaml`` works)."""
    from coati.config.cli import PPO_DESCRIPTION

    return main(argv, prog, PPO_DESCRIPTION, algo="PPO")


def ensure_demo(reward_type: str, env: str | None):
    """The assets of the demo these options run without -m (built once, cached): code, tool use or addition."""
    from coati.config.cli import embedded_demo
    from coati.registry import resolve

    builders = {"addition": "coati.demo.math_demo:ensure_demo_assets",
                "code": "coati.demo.code_demo:ensure_code_demo_assets",
                "multiply": "coati.demo.tool_demo:ensure_tool_demo_assets"}
    return resolve(builders[embedded_demo(reward_type, env)])()


def placeholder_demo():
    """Stands in for the demo assets while the flags are checked, so bad flags fail before the (cached) build."""
    from coati.demo.assets import DemoAssets
    from coati.launcher.preflight import PLACEHOLDER

    return DemoAssets(model_dir=PLACEHOLDER, train_path=PLACEHOLDER, eval_path=PLACEHOLDER, report={})


if __name__ == "__main__":
    sys.exit(main())
