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

An actor can also hang alive (a wedged engine, a rank that never reaches its collective): every wait of
``gather`` has a bound from ``deadlines.Deadlines``. Past it the driver asks the buffer, which always answers,
what the step waits for: a round whose share is missing names the inferencer generating it; otherwise the trainer
ranks that have begun fewer steps than their peers (the peers wait for them in a collective), or all unanswered
ranks when none is behind. ``ActorStuck`` is that one line. The stuck call is inside a step, whose state a
checkpoint cannot take, so the line names the newest complete checkpoint instead.
"""

from __future__ import annotations

import time

import ray

from coati.cluster.deadlines import Deadlines

PRODUCER_RESTARTS = 3  # restarts per inferencer; one that keeps dying (e.g. out of memory at load) stops the run
DEATH_TIMEOUT_S = 10.0  # how long a failure may take to show which actor died


class RunStopped(RuntimeError):
    """An actor the run cannot do without died; the message is the one line to show."""


class OneLineFailure(RuntimeError):
    """A failure inside an actor that says in its message, in one line, what failed and what to change (e.g. an
    inference engine's: rollout/engine_guard.py); the driver shows that line instead of the actor's traceback."""


class ActorStuck(RunStopped):
    """An actor did not answer within its wait's bound; the message is the one line to show."""


PRODUCER_OPTIONS = {"max_restarts": PRODUCER_RESTARTS, "max_task_retries": -1}


class Supervisor:
    def __init__(self, run_dir: str, consumers: list, producers: list, places: dict, buffer=None,
                 deadlines: Deadlines | None = None):
        self.run_dir, self.consumers, self.producers = run_dir, consumers, producers
        self.places = places  # "trainers"/"inferencers" -> [where() of each rank]
        self.generation: list = []  # the producers' run() refs still in flight
        self.in_flight: list = []  # the refs of the gather under way
        self.buffer, self.deadlines = buffer, deadlines or Deadlines(scale=0)
        self.last_step = 0  # the run's last completed step, for the stuck line
        self.producer_of: dict = {}  # a run() ref -> its producer's rank

    def watch(self, generation: list) -> None:
        """The producers' ``run`` refs, in rank order."""
        self.generation = list(generation)
        self.producer_of = {ref: rank for rank, ref in enumerate(generation)}

    def gather(self, refs: list, kind: str = "call", phase: str = "answering the driver") -> list:
        """``ray.get(refs)``, but raising as soon as any of them fails or a producer's ``run`` fails, and
        ``ActorStuck`` once the wait passes the bound of its ``kind`` (``phase``: what the trainer ranks are doing,
        for the line). Every call of a run to its trainer ranks (steps, saves, weight snapshots, resume, shutdown)
        comes through here, so that ``drain`` can collect the calls a dead rank's peers had in flight."""
        pending = self.in_flight = list(refs)
        self._wait(pending, kind, phase, refs)
        return ray.get(refs)

    def wait_generation(self) -> None:
        """Wait for every producer's ``run`` (raising if one failed, or ``ActorStuck`` past a step's bound)."""
        self._wait(None, "step", "finishing its rounds")

    def _wait(self, pending: list | None, kind: str, phase: str, refs: list = ()) -> None:
        """Until ``pending`` is emptied (None: until the producers' runs are done), within the bound of ``kind``."""
        bound, start = self.deadlines.bound(kind), time.monotonic()
        while pending if pending is not None else self.generation:
            left = None if bound is None else max(0.0, bound - (time.monotonic() - start))
            ready, _ = ray.wait((pending or []) + self.generation, num_returns=1, timeout=left)
            if not ready:
                raise self._stuck(list(refs) if pending is not None else None, pending or [], phase, bound)
            for ref in ready:
                ray.get(ref)  # a failure raises here
                if ref in self.generation:
                    self.generation.remove(ref)  # that producer is done
                else:
                    pending.remove(ref)
        self.deadlines.record(kind, time.monotonic() - start)

    def _stuck(self, refs: list | None, pending: list, phase: str, bound: float) -> ActorStuck:
        """The line for a wait past its bound (``refs`` None: the wait for the producers' runs): who is stuck doing
        what (see the module's docstring)."""
        try:
            stall = ray.get(self.buffer.stall.remote(), timeout=DEATH_TIMEOUT_S) if self.buffer is not None else {}
        except (ray.exceptions.GetTimeoutError, ray.exceptions.RayError):
            stall = {}
        missing = stall.get("missing")
        if refs is None:
            who, what = [("inferencer", self.producer_of.get(ref, "?")) for ref in self.generation], phase
        elif missing is not None and isinstance(missing["source"], int):
            role = "inferencer" if self.producers else "trainer rank"  # --colocate: the ranks generate
            who, what = [(role, missing["source"])], f"generating round {missing['round']}"
        else:
            silent = [rank for rank, ref in enumerate(refs) if ref in pending] if len(refs) == len(self.consumers) \
                else list(range(len(self.consumers)))
            begun = {rank: stall.get("notes", {}).get(("trainer rank", rank), 0) for rank in silent}
            behind = [rank for rank in silent if begun[rank] < max(begun.values(), default=0)]
            who, what = [("trainer rank", rank) for rank in behind or silent], phase
            if behind:
                what = f"before step {self.last_step + 1} (its peers wait for it in the step's collectives)"
        return ActorStuck(stuck_line([self._name(role, rank) for role, rank in who], what, bound,
                                     self.deadlines.scale, self.run_dir, last_step=self.last_step))

    def _name(self, role: str, rank: int) -> str:
        from coati.cluster.connect import node_label

        places = self.places.get("trainers" if role == "trainer rank" else "inferencers", [])
        place = places[rank] if isinstance(rank, int) and rank < len(places) else {}
        return f"{role} {rank} (pid {place.get('pid', '?')} on {node_label(place)})"

    def stopped(self, error: Exception) -> Exception:
        """The RunStopped to raise for ``error`` when an actor died (else ``error`` itself).

        The first failure to arrive is often not the dead rank's own but a survivor's (its collective lost a
        peer): the dead actor is then found by pinging every actor, the dead one failing as soon as Ray has
        marked it dead, which may take a few seconds on a loaded machine."""
        if isinstance(error, ray.exceptions.OutOfMemoryError):
            dead = self._find_dead(None)
            who = self._name(*dead) if dead is not None else "an actor of the run"
            return RunStopped(f"Ray's memory monitor killed {who}: {memory_line(str(error))}; the run stopped. "
                              f"{resume_hint(self.run_dir)}")
        if not isinstance(error, (ray.exceptions.RayActorError, ray.exceptions.RayTaskError)):
            return error
        stop = _own_line(error)
        if stop is not None:  # a user reward or an engine raised, or the reward server stayed down: its line says it
            return RunStopped(f"{stop}; the run stopped. {resume_hint(self.run_dir)}")
        dead = self._find_dead(getattr(error, "actor_id", None))
        if dead is None:
            return error  # an exception inside a live actor: its traceback says more than a summary would
        role, rank = dead
        what = f"{self._name(role, rank)} died"
        if role == "inferencer":
            what += f" after {PRODUCER_RESTARTS} restarts"
        return RunStopped(f"{what}; the run stopped. {resume_hint(self.run_dir)}")

    def _find_dead(self, actor_id: str | None) -> tuple[str, int] | None:
        if actor_id is not None and not isinstance(actor_id, str):
            actor_id = actor_id.hex() if hasattr(actor_id, "hex") else None
        actors = {actor._actor_id.hex(): ("trainer rank", rank) for rank, actor in enumerate(self.consumers)}
        actors.update({actor._actor_id.hex(): ("inferencer", rank) for rank, actor in enumerate(self.producers)})
        if actor_id in actors:
            return actors[actor_id]
        pings = {actor.__ray_ready__.remote(): actor._actor_id.hex() for actor in self.consumers + self.producers}
        pending, deadline = list(pings), time.time() + DEATH_TIMEOUT_S
        while pending and time.time() < deadline:
            ready, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, deadline - time.time()))
            for ping in ready:
                try:
                    ray.get(ping)
                except (ray.exceptions.RayActorError, ray.exceptions.OutOfMemoryError):  # killed for memory: dead
                    return actors[pings[ping]]
        return None  # the others answered or are busy (e.g. blocked in a collective with the dead rank)

    def cancel_generation(self, timeout: float = DEATH_TIMEOUT_S) -> None:
        """End the producers' ``run`` calls as cancelled, before their actors are killed: a call cut off by the
        kill alone would count as a failure to retry (``max_task_retries``), and Ray would say so on the
        driver's terminal. A cancelled call is never retried; one that does not end in ``timeout`` is killed."""
        for ref in self.generation:
            ray.cancel(ref)
        ready, _ = ray.wait(self.generation, num_returns=len(self.generation), timeout=timeout) \
            if self.generation else ([], [])
        for ref in ready:
            try:
                ray.get(ref)
            except Exception:  # noqa: BLE001 - TaskCancelledError, or a run() that had just ended
                pass
            self.generation.remove(ref)

    def kill_all(self) -> None:
        for actor in self.producers + self.consumers:
            ray.kill(actor, no_restart=True)

    def drain(self, timeout: float = DEATH_TIMEOUT_S) -> None:
        """Collect the failures of the calls still in flight once the run has stopped (the actors killed): Ray
        prints a failure nobody fetched as an "Unhandled error" traceback when its ref is dropped, which would
        land after the one line that says what happened."""
        refs = self.in_flight + self.generation
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout) if refs else ([], [])
        for ref in ready:
            try:
                ray.get(ref)
            except Exception:  # noqa: BLE001 - each is a consequence of the failure already reported
                pass
        self.in_flight, self.generation = [], []


def _own_line(error: Exception):
    """The failure inside an actor's error that carries its own line, if that is what it is: a user reward's, the
    reward server's, or any ``OneLineFailure`` (an engine's)."""
    from rewards.remote import RemoteRewardError
    from rewards.user import RewardFnError

    cause = getattr(error, "cause", None)
    return cause if isinstance(cause, (RewardFnError, RemoteRewardError, OneLineFailure)) else None


def memory_line(message: str) -> str:
    """What a Ray out-of-memory kill says of the node's memory, and what to change: the run's own knobs first, since
    the plan fitted the defaults (``--dry-run`` shows each actor's estimate)."""
    import re

    found = re.search(r"was ([\d.]+)GB used / ([\d.]+)GB limit", message)
    used = f"the node used {found.group(1)} of {found.group(2)} GB" if found else "the node ran out of memory"
    return (f"{used}. Lower -tmbs (the trainer's micro-batch) or --vllm-kv-cache-gb, or end other processes on the "
            "node (--dry-run shows each actor's estimate)")


def stuck_line(names: list[str], doing: str, bound: float, wait_scale: float, run_dir: str, stopped: str = "run",
               last_step: int | None = None) -> str:
    """The one line of a wait past its bound, for an RL run and an SFT/RM stage alike: who is stuck (``names``),
    doing what (``doing``: "in step", "generating round 3"), how long the driver waited and under which
    --wait-scale, the last completed step when known, that the ``stopped`` ("run", "stage") stopped, what to
    change when the call was only slow, and how to continue."""
    step = f"last completed step {last_step}; " if last_step is not None else ""
    return (f"{', '.join(names)} {'is' if len(names) == 1 else 'are'} stuck {doing}: no answer within {bound:.1f} s "
            f"(--wait-scale {wait_scale:g}); {step}the {stopped} stopped. If the call is only slow, raise "
            f"--wait-scale. {resume_hint(run_dir)}")


def resume_hint(run_dir: str) -> str:
    from coati.utils.checkpoint import list_checkpoints

    checkpoints = list_checkpoints(run_dir)
    if not checkpoints:
        return f"No complete checkpoint under {run_dir} yet: start again (-si N saves one every N steps)."
    return f"Continue it with --resume {checkpoints[-1][1]} (the newest complete checkpoint; or --resume latest)."
