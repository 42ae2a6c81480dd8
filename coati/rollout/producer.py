"""The inferencer actor: samples G completions per prompt, scores them, and feeds the rollout buffer."""

from __future__ import annotations

import os
import warnings

import ray
import torch

from coati.cluster.weight_sync import make_receiver
from coati.config.tree import RLConfig
from coati.config.sampling import SamplingParams
from coati.rollout.engine_guard import EngineFailed, build_engine
from coati.rollout.round_generator import RoundGenerator
from coati.utils.actor_process import start_actor_process
from coati.utils.device import precision_name
from coati.utils.machine import usable_cores


def make_backend(config: RLConfig, rank: int = 0, role: str = "producer", who: str | None = None):
    """The inference engine of a producer (or of the evaluator, ``role="evaluator"``) on the device and in the
    dtype the device rule gives this actor; its failures are one line naming ``who`` (engine_guard.py)."""
    return build_engine(config.parallel.backend_spec, config, rank, config.parallel.model_placement(role),
                        who or f"inferencer {rank}")


class Producer:
    """Runs as a Ray actor (a plain, single-threaded one: math-verify needs the main thread): a RoundGenerator
    fed with published weights, putting each round into the buffer."""

    def __init__(self, config: RLConfig, rank: int, buffer, weight_store, num_threads: int | None = None):
        start_actor_process(config.parts)
        # buffer and weight store may come as actor names: a restartable actor's constructor arguments must hold
        # no references (Ray warns on every run that a restart could fail once they are gone).
        buffer, weight_store = (ray.get_actor(h) if isinstance(h, str) else h for h in (buffer, weight_store))
        self.config, self.rank, self.buffer, self.weight_store = config, rank, buffer, weight_store
        torch.set_num_threads(num_threads or usable_cores())
        torch.manual_seed(config.run.seed + 1000 + rank)
        # collective: joins the group and receives in the background from here on (also while the model loads)
        p = config.parallel
        self.weights = make_receiver(p.weight_sync, weight_store, rank, p.num_inferencers, p.weight_sync_timeout_s)
        self.version, self.start_failure = 0, None
        try:
            self.backend = make_backend(config, rank)
        except EngineFailed as failure:  # raised at the driver's first call: a failed constructor prints a traceback
            self.start_failure = failure
            return
        self.rounds = RoundGenerator(config, rank, self.backend)

    def info(self) -> dict:
        """The round generator's facts, and the precision this engine computes in (the delivery check's bound)."""
        if self.start_failure is not None:
            raise self.start_failure
        dtype = self.config.parallel.model_placement("producer").dtype
        return {**self.rounds.info(), "engine_precision": precision_name(dtype)}

    def _sync_weights(self, min_version: int, timeout_s: float = 600.0) -> None:
        """Wait for a version >= ``min_version`` and load the newest one (newer than ours)."""
        self.version = self.weights.load_newest(self.backend.load_weights, self.version, min_version, timeout_s)

    def _refresh_weights(self) -> None:
        """Load the newest published weights if they are newer than ours; never waits (async mode)."""
        self.version = self.weights.load_newest(self.backend.load_weights, self.version)

    def run(self, num_rounds: int, start_round: int = 0) -> int:
        """Generate rounds ``start_round`` .. ``num_rounds - 1`` and put each, whole, into the buffer.

        Round r starts once the schedule admits it (weights version >= r - S; sync mode: exactly r). Each
        round samples with a seed of its own (seed, rank, round), so a resumed sync run samples what the
        uninterrupted run did there. In async mode a round is generated ``-imbs`` prompts per call, and newer
        weights published meanwhile are loaded between calls: a round may mix versions, each group records
        its own.

        A producer Ray restarted after its process died (supervision.py) runs this again: it continues at its
        first round the buffer has not received, which it regenerates (in sync mode, exactly as before).
        """
        start_round = max(start_round, ray.get(self.buffer.next_round.remote(self.rank)))
        with warnings.catch_warnings():  # the property reads a deprecated one inside Ray
            warnings.simplefilter("ignore")
            restarted = ray.get_runtime_context().was_current_actor_reconstructed
        if restarted:
            print(f"inferencer {self.rank} restarted on {ray.util.get_node_ip_address()} (pid {os.getpid()}): "
                  f"generating round {start_round} again", flush=True)
        imbs = self.config.batch.inference_microbatch_size
        schedule = self.config.schedule
        for round_index in range(start_round, num_rounds):
            self._sync_weights(schedule.min_version(round_index))
            batch = self.rounds.batch(round_index)
            if not schedule.is_async:  # one call: the backend splits it into -imbs micro-batches itself
                groups = self.rounds.rollout(batch, self.rounds.round_params(round_index), self.version)
            else:
                groups = []
                for chunk, start in enumerate(range(0, len(batch), imbs)):
                    if chunk:
                        self._refresh_weights()
                    groups += self.rounds.rollout(batch[start : start + imbs],
                                                  self.rounds.round_params(round_index, chunk), self.version)
            ray.get(self.buffer.put.remote(groups, self.rank, round_index))
        return max(0, num_rounds - start_round)

    def evaluate(self, path: str, params: SamplingParams, latest_weights: bool = True) -> dict:
        """Accuracy on a held-out jsonl with the newest published weights; records for the eval logs."""
        if latest_weights:
            self._sync_weights(0)
        return self.rounds.evaluate(path, params, self.version)
