"""How long the driver waits for an actor before it calls it stuck: one bound per kind of wait, derived from the run.

A wait of a kind never seen complete (the first step, the first save) may take as long as start-up does (models
loading, an engine compiling, the first round generated): ``START_S``. Once one has completed, a later one is
stuck after ``MULTIPLE`` times the slowest seen so far, and never sooner than ``FLOOR_S``: a step that suddenly
takes ten times its worst is not slow, it is hung, while a short run's fast steps must not make a one-off pause
(a garbage collection, a page-in) fatal. ``--wait-scale`` multiplies every bound (0: wait forever), and no bound
falls below ``least_s``: an inner wait with its own deadline (a reward server's tries) must be able to end and
say so itself before the driver blames the actor around it.

Pure arithmetic: the driver records what it measured and asks; tests hold it against hand-computed values.
"""

from __future__ import annotations

from dataclasses import dataclass, field

START_S = 1800.0  # a first wait of a kind: loading a large model and compiling an engine fit in half an hour
MULTIPLE = 10.0  # a later wait: this many times the slowest of its kind
FLOOR_S = 300.0  # ... and never less than this


@dataclass
class Deadlines:
    scale: float = 1.0  # --wait-scale; 0: no bound
    least_s: float = 0.0  # no bound below this, whatever the scale
    start_s: float = START_S
    multiple: float = MULTIPLE
    floor_s: float = FLOOR_S
    slowest: dict = field(default_factory=dict)  # kind -> the longest completed wait of that kind, seconds

    def bound(self, kind: str) -> float | None:
        """Seconds a wait of ``kind`` may take before the actor is stuck; None: no bound (``scale`` 0)."""
        if self.scale == 0:
            return None
        seen = self.slowest.get(kind)
        base = self.start_s if seen is None else max(self.floor_s, self.multiple * seen)
        return max(base * self.scale, self.least_s)

    def record(self, kind: str, seconds: float) -> None:
        """A wait of ``kind`` completed after ``seconds``."""
        self.slowest[kind] = max(self.slowest.get(kind, 0.0), seconds)
