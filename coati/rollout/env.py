"""Environments for multi-turn episodes, and loading one named on the command line.

An environment is a class with ``reset(row)`` and ``step(model_text)``; one instance serves one episode.
``reset`` gets the dataset row (an ``Example``) and returns text to append after the prompt before the model's
first turn, or None. ``step`` gets what the model wrote in its last turn (its own tokens decoded, never the
environment's text) and returns a ``StepResult``: the observation to append (tokenised on its own and
masked out of the loss), a reward, whether the episode is over, and info (``tool_call``: the tool's name when
the turn called one; ``tool_error`` / ``tool_timeout``: True when that call failed). The episode's reward is
the sum of the rewards of its steps.

``ToolEnv`` is the usual case: the model calls tools as ``<tool_call>{"name": ..., "arguments": {...}}
</tool_call>`` (generation stops at the closing tag); a turn without a call is the final answer, which
``score(row, text)`` grades. A user's file subclasses it, lists ``tools`` (plain typed functions) and
overrides ``score``; ``--env path/to/file.py:ClassName`` or a registry name (``ENVS``; ``@register_env``) selects it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from dataclasses import dataclass, field
from typing import Callable

from coati.rollout.tools import Toolbox
from coati.utils.user_parts import registrar
from rewards.types import example_label

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"


class EnvLoadError(ValueError):
    """``--env`` names nothing usable; the message is the one line to show."""


@dataclass
class StepResult:
    observation: str = ""
    reward: float = 0.0
    done: bool = False
    info: dict = field(default_factory=dict)


class Environment:
    """Base class of environments (subclassing is optional: any class with these two methods works)."""

    stop_strings: tuple[str, ...] = ()  # a turn ends at the first of these (kept in the model's output)

    def reset(self, row) -> str | None:
        return None

    def step(self, model_text: str) -> StepResult:
        raise NotImplementedError


def boxed_answer(text: str) -> str | None:
    found = re.findall(r"\\boxed\{([^{}]*)\}", text)
    return found[-1].strip() if found else None


class ToolEnv(Environment):
    """Tool calls until a turn has none; that turn is the answer, graded by ``score``."""

    tools: list[Callable] = []
    stop_strings = (TOOL_CALL_CLOSE,)

    def __init__(self):
        cls = type(self)
        if "_toolbox" not in cls.__dict__:  # tools (and the sandbox's uids) are made once per class, not per episode
            cls._toolbox = Toolbox(self.make_tools())
        self.toolbox = cls.__dict__["_toolbox"]
        self.row = None

    def make_tools(self) -> list[Callable]:
        """The tools of this environment (default: the class attribute ``tools``)."""
        return list(self.tools)

    def reset(self, row) -> str | None:
        self.row = row
        return None

    def score(self, row, text: str) -> float:
        """Reward of the final answer ``text`` (default: 1 when its last \\boxed{} equals the row's label)."""
        answer = boxed_answer(text)
        return float(answer is not None and answer == str(example_label(row)).strip())

    def step(self, model_text: str) -> StepResult:
        end = model_text.rfind(TOOL_CALL_CLOSE)
        start = model_text.rfind(TOOL_CALL_OPEN, 0, max(end, 0))
        if end < 0 or start < 0:
            return StepResult(reward=self.score(self.row, model_text), done=True)
        name, result = self.toolbox.call(model_text[start + len(TOOL_CALL_OPEN) : end].strip())
        info = {"tool_call": name or "?", "tool_error": result.error, "tool_timeout": result.timeout,
                "tool_s": result.seconds}
        return StepResult(observation=self.format_response(result.text), info=info)

    def format_response(self, text: str) -> str:
        return f"\n<tool_response>\n{text.rstrip(chr(10))}\n</tool_response>\n"

    def tool_prompt(self) -> str:
        """A system-prompt paragraph listing the tools' schemas and the call format."""
        schemas = "\n".join(json.dumps(s) for s in self.toolbox.schemas.values())
        return (f"You may call tools. Tools:\n{schemas}\nTo call one, write {TOOL_CALL_OPEN}{{\"name\": ..., "
                f"\"arguments\": {{...}}}}{TOOL_CALL_CLOSE}; its result follows in <tool_response>.")


class PythonToolEnv(ToolEnv):
    """Math with the sandboxed ``python`` tool; the answer goes in \\boxed{}."""

    def make_tools(self):
        from coati.rollout.python_tool import make_python_tool

        return [make_python_tool()]


def multiply(a: int, b: int) -> int:
    """Multiply two integers exactly.

    Args:
        a: the first factor
        b: the second factor
    """
    return a * b


class MultiplyEnv(ToolEnv):
    """The tool demo's environment (``--env tool_demo``): a ``multiply`` tool, the answer in \\boxed{}. No tool
    description is added to the prompt: the demo's tiny model learned the call syntax in its warm start."""

    tools = [multiply]

    def tool_prompt(self) -> str:
        return ""


class MultiplyOffEnv(MultiplyEnv):
    """The tool demo's control (``--env tool_demo_off``): the same episodes, but every call is an error."""

    def make_tools(self):
        def multiply(a: int, b: int) -> int:
            """Multiply two integers exactly (switched off: every call fails).

            Args:
                a: the first factor
                b: the second factor
            """
            raise RuntimeError("the calculator is off")

        return [multiply]


# The names of coati.config.env.TOOL_DEMO_ENVS (without --model: the tool demo's model and task) are here too.
ENVS: dict[str, type] = {"python_tool": PythonToolEnv, "tool_demo": MultiplyEnv, "tool_demo_off": MultiplyOffEnv}

# From your own code (a --plugins file, or a script calling coati.run): ``@register_env("name")`` on the class
# makes ``--env name`` select it in every process.
register_env = registrar(ENVS, "environment", f"{__name__}:ENVS")


def load_env(spec: str) -> type:
    """The environment class named by ``spec``: a registry name or ``path/to/file.py:ClassName``."""
    if spec in ENVS:
        return ENVS[spec]
    if ":" not in spec:
        raise EnvLoadError(f"--env {spec!r}: not a registered environment ({', '.join(ENVS)}) nor "
                           "path/to/file.py:ClassName")
    path, name = spec.rsplit(":", 1)
    if not os.path.isfile(path):
        raise EnvLoadError(f"--env {spec!r}: no file {path!r}")
    module_name = "coati_user_env_" + re.sub(r"\W", "_", os.path.abspath(path))
    module_spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as err:
        raise EnvLoadError(f"--env {spec!r}: importing {path} failed: {type(err).__name__}: {err}") from None
    cls = getattr(module, name, None)
    if not isinstance(cls, type):
        classes = [k for k, v in vars(module).items() if isinstance(v, type) and hasattr(v, "step")
                   and v.__module__ == module_name]
        raise EnvLoadError(f"--env {spec!r}: {path} has no class {name!r} (environment classes there: "
                           f"{', '.join(classes) or 'none'})")
    missing = [m for m in ("reset", "step") if not callable(getattr(cls, m, None))]
    if missing:
        raise EnvLoadError(f"--env {spec!r}: {name} lacks {' and '.join(missing)}(...)")
    return cls


def make_env(cls: type):
    """One instance of ``cls`` (one per episode); a failing constructor is one EnvLoadError line."""
    try:
        return cls()
    except Exception as err:
        raise EnvLoadError(f"environment {cls.__name__}() failed: {type(err).__name__}: {err}") from None
