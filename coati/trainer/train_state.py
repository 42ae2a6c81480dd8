"""A trainer rank's run state in one place: what the rollout feed, the learner and the weight publisher advance,
and what a checkpoint keeps of it (``state_dict`` / ``load_state_dict``).

The saved names are the counters' names of checkpoints written before this class (``COUNTERS``), so those
checkpoints resume unchanged. Every field but the RNG is equal on every rank of the trainer group: each rank
draws the same groups and takes the same steps.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from coati.trainer.round_batches import RoundPool

# Checkpoint key -> field. The keys are those of the consumer state before TrainState (kept: old checkpoints).
COUNTERS = {"step_count": "step", "version": "version", "drawn_total": "drawn_total",
            "drawn_since_sync": "drawn_since_sync", "_draw_serial": "draw_serial", "round_serial": "round_serial"}


@dataclass
class TrainState:
    step: int = 0  # optimizer steps taken (the learning-rate schedule's position)
    version: int = 0  # the weights version the trainer holds
    drawn_total: int = 0  # groups drawn from the buffer so far (the whole group's)
    drawn_since_sync: int = 0  # groups drawn since the last published weights
    draw_serial: int = 0  # draws since the start: each draw's request id, so skipped steps never reuse one
    round_serial: int = 0  # rounds drawn (round-level minibatches): the round permutation's index
    round: RoundPool | None = None  # the round being trained, while steps of it remain
    # Not saved. The newest published version (tracked on every rank; the publisher lives on the sender only).
    published_version: int = 0
    # Whether an optimizer step moved the weights since they were ``version`` (a resumed run cannot tell: it waits
    # for its next publish). Only rows sampled by exactly these weights are checked for delivery.
    trained_since_version: bool = False

    def counters(self) -> dict[str, int]:
        return {key: getattr(self, name) for key, name in COUNTERS.items()}

    def state_dict(self) -> dict:
        """The counters, this process's RNG states and the round in progress (plain values)."""
        return {"counters": self.counters(), "torch_rng": torch.get_rng_state(), "python_rng": random.getstate(),
                "round": self.round.state() if self.round else None}

    def load_state_dict(self, state: dict, restore_rng: bool = True) -> None:
        """Restore ``state_dict()``'s values; the round's tensors are the algorithm's to rebuild. The RNG states
        only where this rank wrote them in the same layout (``restore_rng``)."""
        for key, name in COUNTERS.items():
            setattr(self, name, state["counters"][key])
        self.round = RoundPool.from_state(state["round"]) if state.get("round") else None
        if restore_rng:
            torch.set_rng_state(state["torch_rng"])
            random.setstate(state["python_rng"])
