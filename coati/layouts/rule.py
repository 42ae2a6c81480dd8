"""The one rule that chooses a run's micro-batch layout (pure, torch-free): among the registered layouts this
plugin serves and the model computes exactly, the one whose step costs least (the cost model of registry.py).

- A layout whose flag is ``on`` must be chosen: every such layout must be served and exact (else one line naming
  the flag), and the cheapest of them wins.
- Else every layout whose flag is not ``off`` is a candidate, cheapest first; the first one served and exact wins.
  Padded rows (or the pipelines' rows) need no check, so a layout is checked only where it is cheaper than them:
  ``layouts_to_check`` names those, which the trainer checks on the whole model before its plugin lays it out.

The same rule runs in the trainer as it starts (its model checked: ``exact``) and in the plan of ``--dry-run``
(nothing checked yet: the plan says which check decides).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from coati.layouts.registry import LAYOUTS, LayoutSpec, Situation

Exact = Callable[[str], str]  # a layout's name -> "" where the model gives the padded numbers through it, else why not


@dataclass(frozen=True)
class Choice:
    """The layout a run trains with (its row), its micro-batch size and what the start line adds."""
    spec: LayoutSpec
    size: int
    why: str = ""

    @property
    def name(self) -> str:
        return self.spec.name

    def line(self) -> str:
        """The trainer's one line on it, at the start of a run (and in --dry-run)."""
        return f"trainer micro-batches: {self.spec.what.format(size=self.size)}" + (f"; {self.why}" if self.why else "")

    def build(self):
        """The layout itself (coati.layouts.base.Layout), of this size."""
        return self.spec.load()(self.size)


def unserved(spec: LayoutSpec, s: Situation) -> str:
    """Why this run's plugin cannot run ``spec`` (empty: it can)."""
    if spec.capability and spec.capability not in s.capabilities:
        return spec.unserved.format(plugin=s.plugin)
    if s.gradient_checkpointing and not spec.gradient_checkpointing:
        return spec.unserved.format(plugin=s.plugin)
    return ""


def _fitting(s: Situation) -> list[LayoutSpec]:
    return [spec for spec in LAYOUTS.values() if spec.ragged == s.ragged]


def _forced(s: Situation) -> list[LayoutSpec]:
    return [spec for spec in _fitting(s) if spec.flag and s.flags.get(spec.flag) == "on"]


def _candidates(s: Situation) -> list[LayoutSpec]:
    """The layouts the flags allow, cheapest first (ties: registry order)."""
    allowed = [spec for spec in _fitting(s) if not spec.flag or s.flags.get(spec.flag, "auto") != "off"]
    return sorted(allowed, key=lambda spec: spec.cost(s))


def layouts_to_check(s: Situation) -> tuple[str, ...]:
    """The layouts whose check the rule may ask for: those forced on, else those cheaper than the first one that
    needs no check (and that the plugin serves)."""
    forced = _forced(s)
    if forced:
        return tuple(spec.name for spec in forced if spec.checked and not unserved(spec, s))
    names = []
    for spec in _candidates(s):
        if unserved(spec, s):
            continue
        if not spec.checked:
            break
        names.append(spec.name)
    return tuple(names)


def choose_layout(s: Situation, exact: Exact = lambda name: "") -> Choice:
    """The layout of a run in situation ``s`` (module docstring); ``exact(name)`` is asked only of the layouts
    ``layouts_to_check`` names. A forced layout that cannot run raises ValueError."""
    forced = _forced(s)
    for spec in forced:
        note = unserved(spec, s) or (exact(spec.name) if spec.checked else "")
        if note:
            raise ValueError(f"{spec.option} on: {note}; use {spec.option} auto or off")
    if forced:
        best = min(forced, key=lambda spec: spec.cost(s))
        return Choice(best, best.size(s), best.caveat(s))
    candidates = _candidates(s)
    notes = []
    for index, spec in enumerate(candidates):
        note = unserved(spec, s)
        if note:
            continue  # a flag at auto asks for nothing the plugin lacks: said in --dry-run's plan, not here
        note = exact(spec.name) if spec.checked else ""
        if note:
            notes.append(note)
            continue
        # where none of the flagged layouts won, each one passed over for its cost says why
        dearer = [] if spec.flag else [other.dearer(s) for other in candidates[index + 1:]
                                       if other.flag and not unserved(other, s)]
        why = "; ".join(part for part in [spec.caveat(s), *notes, *dearer] if part)
        return Choice(spec, spec.size(s), why)
    raise ValueError("no micro-batch layout serves this run (every registered one was refused)")


def check_model(model, names: tuple[str, ...]) -> dict[str, bool]:
    """Whether ``model`` (whole, before a plugin lays it out) gives the padded numbers through each named layout."""
    return {name: bool(LAYOUTS[name].load().exact(model)) for name in names}


def exact_from(checked: list[dict[str, bool]]) -> Exact:
    """The rule's ``exact`` of every role's model checks: a layout is exact where every role's model passed."""
    def exact(name: str) -> str:
        passed = all(results.get(name, False) for results in checked)
        return "" if passed else LAYOUTS[name].inexact or f"the model failed the {name} layout's check"
    return exact


def situation_of(config, attention: str | None, parameters: int, ragged: bool | None = None) -> Situation:
    """The rule's view of an RL run's ``config`` with a model of ``attention`` and ``parameters``; ``ragged``:
    whether its plugins take micro-batches of any shape (None: all but pipeline stages do)."""
    from coati.config.batch_defaults import micro_batch_tokens

    p, b = config.parallel, config.batch
    spec = p.plugin_spec
    capabilities = frozenset(name for name in {layout.capability for layout in LAYOUTS.values()} - {None}
                             if getattr(spec, name, False))
    flags = {layout.flag: getattr(b, layout.flag) for layout in LAYOUTS.values() if layout.flag}
    return Situation(ragged=p.pipeline_parallel_size == 1 if ragged is None else ragged,
                     capabilities=capabilities, plugin=p.plugin_name,
                     gradient_checkpointing=config.algo.optim.gradient_checkpointing, flags=flags,
                     attention=attention, parameters=parameters, budget=micro_batch_tokens(config),
                     rows=max(1, b.train_microbatch_size // p.pipeline_parallel_size), groups=b.train_minibatch_size,
                     samples=b.num_generations, prompt=config.data.max_prompt_tokens,
                     response=config.sampling.max_new_tokens)
