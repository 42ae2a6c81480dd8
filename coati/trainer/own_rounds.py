"""A trainer rank's own part of each round, made in its own process with a ``RoundGenerator``: the learner's
(``--learner-chunk-size N``, on the weight sender) and each colocated rank's (``--colocate``, colocated.py).

In sync mode the trainers idle while the producers generate a round. With N > 0 the trainer rank that sends
weights (``plugin.is_weight_sender``) is also generator stream P (after the P producers) of the schedule: right
after publishing version v (and once before the first draw, at version 0) it makes round
``schedule.own_round(v)``'s N groups with exactly those weights, with the run's engine, environment and tools
or reward model as a producer would, and puts them into the shared buffer under the learner's slots. Every
rank then draws them through the normal shared reads, so all ranks agree on the data, DAPO's filter and
dynamic batching work unchanged, and the groups are on-policy. A round therefore holds
``num_inferencers * ibs + N`` groups (``RLConfig.groups_per_sync``).

The learner's engine is the run's (``-b``), on the device the device rule gives the ``learner_generation`` role,
refreshed in place from the full tensors the trainer gathers for each publish (no disk); an engine that cannot
run inside a trainer process (``BackendSpec.colocates``) is replaced by the default one, said once.
"""

from __future__ import annotations

import time

import ray
import torch

from coati.config.tree import RLConfig
from coati.rollout.engine_guard import build_engine
from coati.registry.backends import BACKENDS, DEFAULT_BACKEND
from coati.rollout.round_generator import RoundGenerator
from coati.utils.device import precision_name


class OwnRounds:
    """Fills this rank's part of each round once, timed, without touching the trainer's RNG."""

    def __init__(self, rounds: RoundGenerator):
        self.rounds = rounds
        self.last_round = -1  # the newest round made
        self.time_s = 0.0  # seconds spent generating and scoring since the last ``take_time``

    def info(self) -> dict:
        return self.rounds.info()

    def fill(self, buffer, round_index: int, version: int) -> None:
        """Make this rank's part of ``round_index`` (once) with the weights in the engine, into the buffer."""
        if round_index <= self.last_round:
            return
        groups = self.make(round_index, version)
        self.last_round = round_index
        ray.get(buffer.put.remote(groups, self.rounds.source, round_index))

    def make(self, round_index: int, version: int) -> list:
        """This rank's groups of ``round_index``, sampled with the engine's weights now (tagged ``version``)."""
        start = time.perf_counter()
        rounds = self.rounds
        groups = self.generating(lambda: rounds.rollout(rounds.batch(round_index), rounds.round_params(round_index),
                                                        version))
        self.time_s += time.perf_counter() - start
        return groups

    def generating(self, work):
        """Run ``work`` with the trainer's RNG untouched: the engine seeds the global generator per round."""
        with torch.random.fork_rng(devices=cuda_devices()):
            return work()

    def take_time(self) -> float:
        spent, self.time_s = self.time_s, 0.0
        return spent


class LearnerRounds(OwnRounds):
    """The weight sender's learner-side generation: stream P's rounds on an engine of its own."""

    def __init__(self, config: RLConfig):
        stream = config.parallel.rollout_sources  # the stream after every producer's
        super().__init__(RoundGenerator(config, stream, learner_engine(config, stream)))
        self.precision = precision_name(config.parallel.model_placement("learner_generation").dtype)

    def info(self) -> dict:
        return {**self.rounds.info(), "engine_precision": self.precision}

    def load_weights(self, named_tensors) -> None:
        """The just-published tensors (full weights, or adapters) into the engine, in place."""
        self.rounds.backend.load_weights(named_tensors)


def learner_engine(config: RLConfig, stream: int):
    """The run's engine for learner-side generation, or the default one where it cannot live in a trainer."""
    spec = config.parallel.backend_spec
    if not spec.colocates:
        spec = BACKENDS[DEFAULT_BACKEND]
        print(f"learner-side generation: -b {config.parallel.backend} cannot run inside a trainer process; the "
              f"learner generates with {spec.name}", flush=True)
    return build_engine(spec, config, stream, config.parallel.model_placement("learner_generation"),
                        "the learner")


def cuda_devices() -> list[int]:
    return [torch.cuda.current_device()] if torch.cuda.is_available() and torch.cuda.is_initialized() else []
