"""Every command the README and the guides show goes through the real command's parser and the settings'
validation, without opening the user's files (the example paths name files only users have). A renamed flag,
a dropped alias or a combination validation refuses fails here, not in a user's shell."""

from __future__ import annotations

import contextlib
import glob
import io
import json
import os
import re
import shlex

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGES = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
PREFIXES = {  # how a line starts -> the command it runs
    "coati": None, ".venv/bin/coati": None, "python -m coati.cli": None, ".venv/bin/python -m coati.cli": None,
    "python rl_example.py": "train", ".venv/bin/python rl_example.py": "train",
}
SKETCH = {"...", "FILE", "FILE.yaml", "--help", "-h"}
CODE_BLOCK = re.compile(r"```[a-z]*\n(.*?)```", re.DOTALL)
INLINE = re.compile(r"`([^`\n]+)`")


def command_lines(text: str, inline: bool) -> list[tuple[str, bool]]:
    """(line, from an inline span) for the shell lines of the fenced blocks (continuations joined, `&&` chains
    split) and, with ``inline``, the inline code spans (the README's table of tasks; in the guides' prose a span
    names a command rather than runs it)."""
    lines = []
    for block in CODE_BLOCK.findall(text):
        lines += [(part, False) for line in block.replace("\\\n", " ").splitlines() for part in line.split("&&")]
    if inline:
        lines += [(span, True) for span in INLINE.findall(CODE_BLOCK.sub("", text))]
    return lines


def parse_command(line: str) -> tuple[str, list[str]] | None:
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        return None
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):  # VAR=value before the command
        words = words[1:]
    for prefix, command in sorted(PREFIXES.items(), key=lambda item: -len(item[0])):
        size = len(prefix.split())
        if words[:size] == prefix.split():
            rest = words[size:]
            if command is None:
                if not rest or rest[0].startswith("-"):
                    return None
                command, rest = rest[0], rest[1:]
            if re.search(r"[/|]", command) or any(word in SKETCH or word.startswith("[") for word in rest):
                return None  # a sketch of a command, or its help, not one to run
            return command, rest
    return None


def doc_commands() -> list[tuple[str, str, list[str]]]:
    found = []
    for page in PAGES:
        with open(page) as f:
            for line, inline in command_lines(f.read(), inline=page.endswith("README.md")):
                parsed = parse_command(line.strip())
                if parsed and (parsed[1] or not inline):  # a bare `coati ppo` in prose is a name
                    found.append((os.path.relpath(page, ROOT), *parsed))
    return found


COMMANDS = doc_commands()


def test_the_docs_show_the_common_commands():
    shown = {command for _, command, _ in COMMANDS}
    assert {"train", "ppo", "rlhf", "evaluate", "plot"} <= shown, shown
    readme = [argv for page, command, argv in COMMANDS if page == "README.md"]
    assert any("--resume" in argv for argv in readme) and any("--master_address" in argv for argv in readme)


def stand_in_files(argv: list[str], where) -> list[str]:
    """The checkout's config and plugin files by their full path; an empty stand-in for each -ed file (its existence is
    checked with the flags; what is in it, when the run starts)."""
    argv = list(argv)
    for i, word in enumerate(argv[:-1]):
        if word in ("--config", "--plugins"):  # the checkout's files (a plugin is imported: its names validate)
            argv[i + 1] = os.path.join(ROOT, argv[i + 1])
        if word in ("-ed", "--eval-dataset"):
            for path in json.loads(argv[i + 1]).values():
                (where / path).parent.mkdir(parents=True, exist_ok=True)
                (where / path).touch()
    return argv


def check_train(argv: list[str], defaults: dict) -> None:
    from coati.config.cli import config_from_args
    from coati.demo.assets import DemoAssets
    from coati.train import command_flags, command_parser

    parser = command_parser(argv, "coati train", "", defaults)
    args = parser.parse_args(argv)
    command_flags(args)
    demo = None if args.model else DemoAssets(model_dir="/demo/model", train_path="/demo/train.jsonl",
                                              eval_path="/demo/eval.jsonl", report={})
    config_from_args(args, demo, parser.given)


def check_stage(cls, argv: list[str]) -> None:
    from coati.config.stage import validate
    from coati.utils.dataclass_cli import parse

    validate(parse(cls, argv, "coati stage", ""))


def check_flags_in_help(command: str, argv: list[str]) -> None:
    """Commands whose parser is built inside their main: every flag shown must be one of theirs."""
    from coati.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main([command, "--help"])
    for word in argv:
        if word.startswith("-"):
            assert re.search(rf"(^|[\s\[,]){re.escape(word.split('=')[0])}([\s\],=]|$)", out.getvalue(), re.MULTILINE), word


@pytest.mark.parametrize("page,command,argv", COMMANDS, ids=[f"{p}:{c}:{' '.join(a)[:60]}" for p, c, a in COMMANDS])
def test_doc_command_parses_and_validates(page, command, argv, monkeypatch, tmp_path, registries_restored):
    argv = stand_in_files(argv, tmp_path)
    monkeypatch.chdir(tmp_path)
    if command in ("train", "ppo"):
        check_train(argv, {"algo": "PPO"} if command == "ppo" else {})
    elif command in ("sft", "rm"):
        from coati.config.stage import RMConfig, SFTConfig

        check_stage(SFTConfig if command == "sft" else RMConfig, argv)
    elif command == "evaluate":
        from coati.rlhf.eval_config import EvalConfig
        from coati.utils.dataclass_cli import parse

        parse(EvalConfig, argv, "coati evaluate", "")
    elif command == "rlhf":
        check_flags_in_help(command, argv)
        if "--config" in argv:
            from coati.rlhf.pipeline import ppo_config, read_plan, stage_config

            plan = read_plan(argv[argv.index("--config") + 1])
            for stage in plan.stages:
                ppo_config(plan, check_files=False) if stage == "ppo" else stage_config(plan, stage)
    elif command == "export":
        from coati.export import build_parser

        args = build_parser("coati export").parse_args(argv)
        assert args.merge, f"{page}: coati export without --merge exports nothing"
    else:
        assert command in ("plot",), f"{page}: unknown command coati {command}"
        check_flags_in_help(command, argv)
