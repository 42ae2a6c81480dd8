"""Weights verified, not assumed: each published version is checked where it is first trained on.

At a step whose trainer weights are exactly version V (no optimizer step since V was published, or the initial
weights for V = 0), the trainer scores the rows V's engines sampled; the largest gap between those logprobs and
the engine's (``delivery_gap``, coati/trainer/objective.py) is numeric noise when the engines got V, and far more
when they generate with other weights: a version never loaded, a tensor or the LoRA adapters lost on the way.
The bound depends on the precision of the engines and the trainer (coati/config/run.py ``DELIVERY_BOUNDS``).
"""

from __future__ import annotations

from dataclasses import dataclass

from coati.cluster.supervision import RunStopped
from coati.config.tree import RLConfig


class WeightsNotDelivered(RunStopped):
    """--delivery-check stop: the run ended (after a checkpoint) because a version's engines did not generate with
    the weights the trainer published."""


@dataclass(frozen=True)
class DeliveryCheck:
    mode: str  # stop | warn | off
    bound: float
    precision: str  # the least precise of the engines' and the trainer's, for the line
    weight_sync: str
    backend: str

    @classmethod
    def of(cls, config: RLConfig, engine_precisions: list[str]) -> DeliveryCheck:
        least = next((p for p in (config.parallel.precision, *engine_precisions) if p != "fp32"), "fp32")
        return cls(config.run.delivery_check, config.run.delivery_limit(least), least, config.parallel.weight_sync,
                   config.parallel.backend)

    @property
    def stops(self) -> bool:
        return self.mode == "stop"

    def problem(self, step: int, metrics: dict) -> str | None:
        """One line when ``metrics`` (a trained step's) show a version its engines did not generate with."""
        gap = metrics.get("delivery_gap")
        if self.mode == "off" or gap is None or gap <= self.bound:
            return None
        return (f"step {step}: weights v{metrics['delivery_version']} did not reach the engines as trained: the "
                f"rows they sampled score up to {gap:.3g} nats apart from the trainer's (bound {self.bound:g} in "
                f"{self.precision}); check the weight sync (--weight-sync {self.weight_sync}) and -b {self.backend}'s "
                "weight loading (--delivery-check warn goes on; --delivery-bound sets the bound)")
