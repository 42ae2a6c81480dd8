"""The driver's watch over a run's actors: inferencers come back when their process dies, trainer ranks stop
the run with one line saying how to continue it.

Inferencers (producers) keep no state that the rest of the run needs: Ray restarts a dead one's process in its
placement-group bundle (``max_restarts``), runs ``__init__`` again and retries the ``run`` call it was in
(``max_task_retries``). ``Producer.run`` then starts at its first round the buffer has not received, after
loading the newest weights that round may use; the buffer's fixed per-source slots take each round exactly
once (a second put of a round raises), so no group is lost or trained on twice. A put is never lost on the
way either: it is the producer's last act for a round, and a restart (a new process, imports, the model)
takes far longer than a put already sent takes to land. In sync mode the round is regenerated from its own
seed with the same weights: the run's numbers do not change.

Trainer ranks hold optimizer shards and a process group: a dead one cannot be replaced mid-run. ``gather``
waits for the trainers' calls and for the producers' ``run`` calls together, so a dead rank, or a producer
that failed for good, stops the run at once instead of leaving the others waiting on a collective or on the
buffer; ``stopped`` turns the failure into a ``RunStopped`` line naming the rank, its node and the newest
complete checkpoint to pass to ``--resume``.
"""

from __future__ import annotations

import ray

PRODUCER_RESTARTS = 3  # restarts per inferencer; one that keeps dying (e.g. out of memory at load) stops the run
PING_TIMEOUT_S = 2.0


class RunStopped(RuntimeError):
    """An actor the run cannot do without died; the message is the one line to show."""


PRODUCER_OPTIONS = {"max_restarts": PRODUCER_RESTARTS, "max_task_retries": -1}


class Supervisor:
    def __init__(self, run_dir: str, consumers: list, producers: list, places: dict):
        self.run_dir, self.consumers, self.producers = run_dir, consumers, producers
        self.places = places  # "trainers"/"inferencers" -> [where() of each rank]
        self.generation: list = []  # the producers' run() refs still in flight

    def watch(self, generation: list) -> None:
        self.generation = list(generation)

    def gather(self, refs: list) -> list:
        """``ray.get(refs)``, but raising as soon as any of them fails or a producer's ``run`` fails."""
        pending = list(refs)
        while pending:
            ready, _ = ray.wait(pending + self.generation, num_returns=1)
            for ref in ready:
                ray.get(ref)  # a failure raises here
                if ref in self.generation:
                    self.generation.remove(ref)  # that producer is done
                else:
                    pending.remove(ref)
        return ray.get(refs)

    def wait_generation(self) -> None:
        """Wait for every producer's ``run`` (raising if one failed)."""
        while self.generation:
            ready, _ = ray.wait(self.generation, num_returns=1)
            for ref in ready:
                ray.get(ref)
                self.generation.remove(ref)

    def stopped(self, error: Exception) -> Exception:
        """The RunStopped to raise for ``error`` when an actor died (else ``error`` itself)."""
        if not isinstance(error, (ray.exceptions.RayActorError, ray.exceptions.RayTaskError)):
            return error
        dead = self._dead("trainer rank", self.consumers, "trainers")
        if not dead:
            dead = self._dead("inferencer", self.producers, "inferencers")
            if dead:
                dead[0] += f" and was restarted {PRODUCER_RESTARTS} times already"
        if not dead:
            return error  # an exception inside a live actor: its traceback says more than a summary would
        return RunStopped(f"{dead[0]}; the run stopped. {resume_hint(self.run_dir)}")

    def _dead(self, role: str, actors: list, key: str) -> list[str]:
        """'<role> R (pid P on IP (node ID)) died' for the first of ``actors`` whose process is gone."""
        pings = [actor.__ray_ready__.remote() for actor in actors]
        ready, _ = ray.wait(pings, num_returns=len(pings), timeout=PING_TIMEOUT_S)
        for rank, ping in enumerate(pings):
            if ping not in ready:
                continue  # alive, busy (e.g. blocked in a collective with the dead rank)
            try:
                ray.get(ping)
            except ray.exceptions.RayActorError:
                from coati.distributed.cluster import node_label

                place = self.places.get(key, [])[rank] if rank < len(self.places.get(key, [])) else {}
                return [f"{role} {rank} (pid {place.get('pid', '?')} on {node_label(place)}) died"]
        return []

    def kill_all(self) -> None:
        for actor in self.producers + self.consumers:
            ray.kill(actor, no_restart=True)


def resume_hint(run_dir: str) -> str:
    from coati.utils.checkpoint import list_checkpoints

    checkpoints = list_checkpoints(run_dir)
    if not checkpoints:
        return f"No complete checkpoint under {run_dir} yet: start again (-si N saves one every N steps)."
    return f"Continue it with --resume {checkpoints[-1][1]} (the newest complete checkpoint; or --resume latest)."
