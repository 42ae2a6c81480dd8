"""The ``coati`` command: ``coati train [flags]`` (the flags of rl_example.py), ``coati sft`` / ``coati rm``
(the supervised RLHF stages), ``coati ppo`` (``coati train`` with ``-a PPO``), ``coati rlhf`` (the three stages in
one go), ``coati evaluate`` (any checkpoint on a file of prompts), ``coati export --merge`` (a LoRA checkpoint as a
full model), ``coati plot RUN_DIR``.

Subcommands form a registry: a new stage (SFT, reward model, PPO) adds one ``Command`` whose target is a
``main(argv, prog) -> exit code``. Targets are imported only when their command runs, so ``coati plot`` and
``coati --help`` never import torch or Ray.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    target: str  # "module:function"
    help: str


COMMANDS = {
    "train": Command("coati.train:main", "RL post-training over Ray (-a GRPO, DAPO, PG, GSPO, CISPO, DrGRPO or "
                                         "PPO; RLOO, REINFORCE++ through --grpo-config); no flags: the embedded "
                                         "demo"),
    "sft": Command("coati.rlhf.cli:sft_main", "supervised fine-tuning on {prompt, completion} rows (--config sft.yaml)"),
    "rm": Command("coati.rlhf.cli:rm_main", "reward model from {prompt, chosen, rejected} pairs (--config rm.yaml)"),
    "ppo": Command("coati.train:ppo_main", "RLHF-PPO: coati train with -a PPO by default (--reward-model DIR, "
                                           "--config ppo.yaml)"),
    "evaluate": Command("coati.rlhf.evaluate:main", "a checkpoint on a file of prompts: verifiable accuracy and/or "
                                                   "reward-model scores (-m CKPT -d FILE --reward-model RM)"),
    "rlhf": Command("coati.rlhf.pipeline:main", "the RLHF pipeline sft -> rm -> ppo from one YAML file "
                                                 "(--config rlhf.yaml); --dummy: the quickstart on generated data"),
    "export": Command("coati.export:main", "a LoRA checkpoint merged into its base model as a plain HF directory: "
                                           "coati export --merge CKPT OUT"),
    "plot": Command("coati.utils.plot:main", "PNG plots of a run's metrics.jsonl: coati plot RUN_DIR"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: coati COMMAND [ARGS]   (coati COMMAND --help for its flags)", "", "commands:"]
    lines += [f"  {name:<{width}}  {command.help}" for name, command in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    if argv[0] == "--version":
        from importlib.metadata import PackageNotFoundError, version

        try:
            print(f"coati {version('coati-rl')}")
        except PackageNotFoundError:
            print("coati (not installed: pip install -e .)")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"coati: unknown command {name!r}; choose one of {', '.join(COMMANDS)}\n\n{usage()}", file=sys.stderr)
        return 2
    module, function = COMMANDS[name].target.split(":")
    return getattr(importlib.import_module(module), function)(rest, prog=f"coati {name}")


if __name__ == "__main__":
    sys.exit(main())
