"""The micro-batch layouts, one row each: what a layout needs (a plugin that takes ragged micro-batches, a plugin
capability, no gradient checkpointing, a model that passes its check), the flag that lets it be chosen, and what a
step costs through it. Torch-free: the plan of ``--dry-run`` reads the rows without building a layout; each row
names its code as ``"module:Class"`` text (a ``coati.layouts.base.Layout``), imported when a run builds it.

A new layout is one file (its ``Layout``) and one ``register_layout`` row; ``rule.choose_layout`` then weighs it
against the others by its ``cost``.

The cost model counts token positions a step's forward computes, plus a fixed cost for every forward pass
(``pass_tokens``), all measured on a 2-core CPU with SmolLM2-135M (docs/results.md, issue 44):
- a pass costs about ``PASS_TOKENS`` = 128 token positions for a 135M-parameter model
  (benchmarks/bench_train_step.py: a response pass of 32-128 tokens cost alike); its fixed part (Python, kernel
  launches, a layer's weights read once) grows less than its per-token part with the model, so in token positions
  it is taken inversely proportional to the parameters: ~31,000 for the 0.5M-parameter demo models, whose steps
  are overhead-bound, ~2 for a 7B model;
- a packed row carries no padding (7.5% of a length-sorted padded step's tokens); under dense attention
  (sdpa/eager) a row is bounded (``packed_row_tokens``: 512 tokens) and attends over its whole width: with a budget
  above that bound the packed step took 1.29x the padded token-budget step's time (25.61 s against 19.99 s);
- shared prompts compute each group's prompt once and its samples' responses on its KV cache, in at least two
  passes (the prompts, then the responses).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

from coati.config.batch_defaults import packed_row_tokens
from coati.utils.user_parts import note_row

PASS_TOKENS = 128  # a forward pass's fixed cost in token positions, for a model of REFERENCE_PARAMETERS
REFERENCE_PARAMETERS = 135_000_000  # SmolLM2-135M, the model PASS_TOKENS was measured with
PADDING_SHARE = 0.075  # the padding of a token-budget step (rows longest first) that packing removes
DENSE_PACKED = 1.29  # a packed step's time over the padded one's under sdpa/eager attention


@dataclass(frozen=True)
class Situation:
    """What the rule reads of a run: its plugin, its model and the shape of one minibatch (every field a number or
    a name: ``coati.layouts.rule.situation_of`` makes it from a config)."""
    ragged: bool = True  # every role's plugin takes micro-batches of any shape (pipeline stages: no)
    capabilities: frozenset = frozenset()  # the plugin row's true capability fields (coati/registry/plugins.py)
    plugin: str = "single"
    gradient_checkpointing: bool = False
    flags: Mapping[str, str] = field(default_factory=dict)  # a layout's flag field -> auto | on | off
    attention: str | None = "sdpa"  # the model's attention implementation
    parameters: int = REFERENCE_PARAMETERS
    budget: int = 1536  # tokens per micro-batch (-tmbt)
    rows: int = 16  # samples per micro-batch where the plugin splits rows (-tmbs / -pp)
    groups: int = 8  # prompts per minibatch (-tMbs)
    samples: int = 8  # samples per prompt (-g)
    prompt: int = 64  # tokens of a prompt, at most (-mpt)
    response: int = 32  # tokens of a response, at most (-mnt)


def pass_tokens(s: Situation) -> float:
    """A forward pass's fixed cost in token positions for a model of ``s.parameters``."""
    return PASS_TOKENS * REFERENCE_PARAMETERS / max(1, s.parameters)


def _passes(tokens: float, budget: int) -> int:
    return max(1, -(-int(tokens) // max(1, budget)))


def padded_cost(s: Situation) -> float:
    """Every sample's prompt and response, padded rows; one pass per budget's worth."""
    tokens = s.groups * s.samples * (s.prompt + s.response)
    return tokens + _passes(tokens, s.budget) * pass_tokens(s)


def rows_cost(s: Situation) -> float:
    """As padded, in micro-batches of ``rows`` samples."""
    tokens = s.groups * s.samples * (s.prompt + s.response)
    return tokens + _passes(s.groups * s.samples, s.rows) * pass_tokens(s)


def packed_cost(s: Situation) -> float:
    """The real tokens only, in rows of ``packed_row_tokens``; slower by ``DENSE_PACKED`` where dense attention
    bounds a packed row below the budget (smaller matmuls, attention over the whole row)."""
    tokens = s.groups * s.samples * (s.prompt + s.response) * (1 - PADDING_SHARE)
    row = packed_row_tokens(s.attention, s.budget)
    cost = tokens + _passes(tokens, row) * pass_tokens(s)
    return cost if row == s.budget else cost * DENSE_PACKED


def shared_cost(s: Situation) -> float:
    """Each group's prompt once, every sample's response; a prompt pass and a response pass per budget's worth."""
    tokens = s.groups * (s.prompt + s.samples * s.response)
    return tokens + 2 * _passes(tokens, s.budget) * pass_tokens(s)


def _budget(s: Situation) -> int:
    return s.budget


def _packed_row(s: Situation) -> int:
    return packed_row_tokens(s.attention, s.budget)


def _packed_caveat(s: Situation) -> str:
    row = _packed_row(s)
    return "" if row == s.budget else f"{s.attention} attention spans a whole packed row: at most {row} tokens a row"


def _packed_dearer(s: Situation) -> str:
    if _packed_row(s) < s.budget:
        return (f"not packed: {s.attention} attention spans a whole packed row, which made a step slower than "
                "padded rows (--packing on packs anyway)")
    return "not packed: it computes more than the layout chosen"


def _shared_dearer(s: Situation) -> str:
    return (f"not shared: a forward pass of a model of {s.parameters:,} parameters costs about "
            f"{pass_tokens(s):,.0f} token positions, more than running each prompt once saves "
            "(--shared-prompts on shares anyway)")


def _nothing(s: Situation) -> str:
    return ""


@dataclass(frozen=True)
class LayoutSpec:
    name: str
    build: str  # "module:Class", a coati.layouts.base.Layout, built as Class(size)
    what: str  # the start line's words on it, ``{size}`` filled in
    cost: Callable[[Situation], float]  # token positions of one minibatch's forward passes
    size: Callable[[Situation], int] = _budget  # its micro-batch size (tokens, or rows for ``rows``)
    ragged: bool = True  # needs a plugin that takes micro-batches of any shape (False: the pipelines' own rows)
    flag: str | None = None  # the BatchConfig field (auto | on | off) that lets it be chosen; None: always may
    capability: str | None = None  # the plugin row's field (coati/registry/plugins.py) its forward needs
    unserved: str = ""  # why not where the plugin lacks it ({plugin} filled in)
    gradient_checkpointing: bool = True  # its forward runs under --gradient-checkpointing
    checked: bool = False  # exact only for a model that passes its check (``Layout.exact``), run as training starts
    inexact: str = ""  # why not where the model failed that check
    caveat: Callable[[Situation], str] = _nothing  # what the start line adds when it is chosen
    dearer: Callable[[Situation], str] = _nothing  # ... when the rule passed it over for its cost

    @property
    def option(self) -> str:
        return "--" + (self.flag or self.name).replace("_", "-")

    def load(self):
        """The layout's class (imported now: it needs torch)."""
        from importlib import import_module

        module, name = self.build.split(":")
        return getattr(import_module(module), name)


LAYOUTS: dict[str, LayoutSpec] = {}


def register_layout(spec: LayoutSpec) -> LayoutSpec:
    """Add a layout's row (a new one, or one replacing a row of the same name); the rule weighs it from then on. A
    row a user's script registers travels to the trainer ranks with the run's config (coati/utils/user_parts.py;
    its ``build`` module must import there: a ``--plugins`` file registers it in every process)."""
    LAYOUTS[spec.name] = spec
    note_row(f"{__name__}:LAYOUTS", "micro-batch layout", spec.name, spec, code=spec.cost)
    return spec


for _spec in (
    LayoutSpec("rows", "coati.layouts.rows:RowsLayout", "{size} rows each (-tmbs per pipeline stage)", rows_cost,
               size=lambda s: s.rows, ragged=False),
    LayoutSpec("padded", "coati.layouts.padded:PaddedLayout", "at most {size} padded tokens each, rows longest first",
               padded_cost),
    LayoutSpec("packed", "coati.layouts.packed:PackedLayout",
               "at most {size} tokens each, the samples packed into one row without padding", packed_cost,
               size=_packed_row, flag="packing", capability="packs_rows",
               unserved="the {plugin} plugin runs a forward of its own", checked=True,
               inexact="the model's attention crosses packed samples (a two-sample forward differed from the padded "
                       "one)", caveat=_packed_caveat,
               dearer=_packed_dearer),
    LayoutSpec("shared", "coati.layouts.shared:SharedPromptsLayout",
               "at most {size} tokens each, whole groups, each group's prompt run once for its samples "
               "(--shared-prompts)", shared_cost, flag="shared_prompts", capability="shares_prompts",
               unserved="it needs the single-process plugin without --gradient-checkpointing",
               gradient_checkpointing=False, checked=True,
               inexact="the model's logits differed when its prompts ran once (a KV-cache forward checked before "
                       "training)", dearer=_shared_dearer),
):
    register_layout(_spec)
