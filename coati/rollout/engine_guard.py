"""An inference engine's own failure as one line: the engine, the error, what to change.

An engine error (vLLM's engine core raising inside ``generate``, a weight load the engine refuses, an engine that
will not start) used to reach the user as a Ray traceback of a hundred lines. Every engine is built through
``build_engine``, which wraps it in ``GuardedEngine``: a failure of its start, ``generate`` or ``load_weights``
becomes ``EngineFailed``, one line naming the actor, the engine and the error, with the engine's registry row's
advice (``BackendSpec.failure_hint``); the full traceback goes to a file in the run directory that the line names.
The driver's supervisor shows that line and stops the run (``cluster/supervision.py``: a ``OneLineFailure``).
"""

from __future__ import annotations

import os
import traceback

from coati.cluster.supervision import OneLineFailure
from coati.registry import resolve


class EngineFailed(OneLineFailure):
    """An inference engine failed; the message is the one line to show."""


def failure_line(who: str, engine: str, doing: str, error: BaseException, hint: str, log_path: str | None) -> str:
    """The one line of an engine failure (pure: the traceback's file is written by the caller)."""
    message = " ".join(str(error).split()) or "(no message)"
    if len(message) > 300:
        message = message[:297] + "..."
    where = f" (traceback: {log_path})" if log_path else ""
    return f"{who}'s engine ({engine}) failed {doing}: {type(error).__name__}: {message}{where}. {hint.rstrip('.')}"


class GuardedEngine:
    """``engine`` with its failures turned into ``EngineFailed``; every other attribute is the engine's own."""

    def __init__(self, engine, name: str, who: str, hint: str, run_dir: str | None):
        self._engine, self._name, self._who, self._hint, self._run_dir = engine, name, who, hint, run_dir

    def __getattr__(self, attribute):
        return getattr(self._engine, attribute)

    def generate(self, prompts, params):
        return self._guarded("generating", self._engine.generate, prompts, params)

    def load_weights(self, named_tensors) -> None:
        return self._guarded("loading new weights", self._engine.load_weights, named_tensors)

    def _guarded(self, doing: str, call, *args):
        try:
            return call(*args)
        except OneLineFailure:
            raise
        except Exception as error:  # noqa: BLE001 - whatever the engine raises becomes its one line
            raise engine_failure(self._who, self._name, doing, error, self._hint, self._run_dir) from error


def engine_failure(who: str, engine: str, doing: str, error: BaseException, hint: str,
                   run_dir: str | None) -> EngineFailed:
    """``EngineFailed`` for ``error``, its traceback written beside the run's other files."""
    log_path = None
    if run_dir:
        log_path = os.path.join(run_dir, f"engine_error_{who.replace(' ', '_')}.log")
        try:
            os.makedirs(run_dir, exist_ok=True)
            with open(log_path, "w") as handle:
                handle.write("".join(traceback.format_exception(error)))
        except OSError:
            log_path = None
    return EngineFailed(failure_line(who, engine, doing, error, hint, log_path))


def build_engine(spec, config, rank: int, placement, who: str) -> GuardedEngine:
    """The engine of registry row ``spec`` for this actor (``who``: "inferencer 0", "the evaluator", ...)."""
    try:
        engine = resolve(spec.build)(config, rank, placement)
    except OneLineFailure:
        raise
    except Exception as error:  # noqa: BLE001
        raise engine_failure(who, spec.name, "to start", error, spec.failure_hint, config.run.run_dir) from error
    return GuardedEngine(engine, spec.name, who, spec.failure_hint, config.run.run_dir)
