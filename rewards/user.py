"""The user's own reward functions: ``--reward-fn path/to/file.py:name``.

Signature: ``name(response: str, label, row: dict)`` -> a number, or ``(number, {"part": number, ...})``
whose named parts go to the logs only; the dict's ``"correct": True/False`` is the function's verdict on the
response instead, which the run's accuracy counts (rewards/correctness.py). ``label`` is the row's label as
scored by the built-in reward (the gold answer for math, the test-case object for code); ``row`` is the whole
dataset row, unchanged.

Every problem is one ``RewardFnError`` line naming the function: at start-up (file, name, signature, a check
call on the first row) and mid-run (the row's ``file:line`` and what the function raised or returned).
"""

from __future__ import annotations

import importlib.util
import inspect
import math
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable

from rewards.correctness import CORRECT_KEY, is_verdict
from rewards.types import Scored


class RewardFnError(RuntimeError):
    """A user reward function could not be loaded, or raised / returned a non-number; one line."""


@dataclass(frozen=True)
class UserReward:
    name: str  # the function's name: what --reward-weights and the logs call it
    spec: str  # as given: path.py:name
    fn: Callable

    def __call__(self, response: str, label: Any, row: dict | None, where: str = "") -> Scored:
        try:
            value = self.fn(response, label, row)
        except Exception as err:  # noqa: BLE001 - whatever the user's code raises ends the run with one line
            raise RewardFnError(f"--reward-fn {self.spec} raised on {where or 'a row'}: "
                                f"{type(err).__name__}: {_first_line(err)}") from None
        return reward_value(value, f"--reward-fn {self.spec} on {where or 'a row'}")


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else "(no message)"


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not _is_numpy_scalar(value):
        raise RewardFnError(f"{what} returned {type(value).__name__} {value!r:.60}; return a number, or "
                            "(number, {name: number}) for named parts, or (number, {\"correct\": bool})")
    number = float(value)
    if not math.isfinite(number):
        raise RewardFnError(f"{what} returned {number}; return a finite number")
    return number


def _is_numpy_scalar(value: Any) -> bool:
    return type(value).__module__ == "numpy" and hasattr(value, "item") and getattr(value, "shape", None) == ()


def reward_value(value: Any, what: str) -> Scored:
    """What a reward function returned, checked: a number, or (number, dict of named numbers and an optional
    ``"correct"`` bool); RewardFnError (one line) otherwise."""
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], dict):
        named = dict(value[1])
        correct = named.pop(CORRECT_KEY, None)
        if correct is not None and not is_verdict(correct):
            raise RewardFnError(f"{what} returned {{{CORRECT_KEY!r}: {correct!r:.40}}} ({type(correct).__name__}); "
                                f"{CORRECT_KEY!r} must be True or False")
        parts = {str(key): _number(part, f"{what} (part {key!r})") for key, part in named.items()}
        return Scored(_number(value[0], what), parts, None if correct is None else bool(correct))
    if isinstance(value, (tuple, list)):
        raise RewardFnError(f"{what} returned a {type(value).__name__} of {len(value)}; return a number or "
                            "(number, {name: number}), e.g. (1.0, {\"correct\": True})")
    return Scored(_number(value, what), {})


def _split_spec(spec: str) -> tuple[str, str]:
    path, sep, name = spec.rpartition(":")
    if not sep or not path or not name:
        raise RewardFnError(f"--reward-fn {spec!r} must be path/to/file.py:function_name")
    if not name.isidentifier():
        raise RewardFnError(f"--reward-fn {spec}: {name!r} is not a Python function name")
    return path, name


def _check_signature(fn: Callable, spec: str) -> None:
    if not callable(fn):
        raise RewardFnError(f"--reward-fn {spec}: {type(fn).__name__} is not callable; name a function")
    try:
        inspect.signature(fn).bind("response", "label", {})
    except TypeError:
        raise RewardFnError(f"--reward-fn {spec}: signature {inspect.signature(fn)} cannot take (response, "
                            "label, row); define it as def name(response, label, row)") from None
    except ValueError:  # builtins without a signature: the check call decides
        pass


def load_reward_fn(spec: str) -> UserReward:
    """The function ``spec`` names (``path.py:name``), imported from its file; RewardFnError when it cannot."""
    path, name = _split_spec(spec)
    if not os.path.isfile(path):
        raise RewardFnError(f"--reward-fn {spec}: file not found: {path}")
    module_name = f"coati_user_reward_{abs(hash(os.path.abspath(path)))}"
    module = sys.modules.get(module_name)
    if module is None:
        module_spec = importlib.util.spec_from_file_location(module_name, path)
        if module_spec is None or module_spec.loader is None:
            raise RewardFnError(f"--reward-fn {spec}: {path} is not a Python file")
        module = importlib.util.module_from_spec(module_spec)
        try:
            module_spec.loader.exec_module(module)
        except Exception as err:  # noqa: BLE001 - importing the user's file: any error is one line
            raise RewardFnError(f"--reward-fn {spec}: importing {path} raised {type(err).__name__}: "
                                f"{_first_line(err)}") from None
        sys.modules[module_name] = module
    if not hasattr(module, name):
        defined = sorted(k for k, v in vars(module).items() if inspect.isfunction(v) and not k.startswith("_"))
        raise RewardFnError(f"--reward-fn {spec}: {path} has no {name!r} (functions there: "
                            f"{', '.join(defined) or 'none'})")
    fn = getattr(module, name)
    _check_signature(fn, spec)
    return UserReward(name=name, spec=spec, fn=fn)


def check_reward_fn(reward: UserReward, response: str, label: Any, row: dict | None, where: str) -> None:
    """A check call on one row (start-up): RewardFnError when it raises or returns no finite number."""
    reward(response, label, row, where)
