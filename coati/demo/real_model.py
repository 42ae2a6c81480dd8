"""The real-model demos ``--demo NAME`` offers, one row each: a demo is a set of flag defaults on top of a user's-
model run (a shipped model, a task's rows written once into the cache, a reward), so every flag still applies and
the run is what a user's own would be. Torch-free: the CLI reads these rows before it builds its parser."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class RealModelDemo:
    name: str
    summary: str  # the --demo help text's line
    defaults: Callable[[], dict]  # option dest -> default; FileNotFoundError (the install line) when not shipped


def real_model_demos() -> dict[str, RealModelDemo]:
    from coati.demo import gemma3, smollm2

    return {module.NAME: RealModelDemo(module.NAME, module.SUMMARY, module.demo_defaults)
            for module in (smollm2, gemma3)}
