"""The run's supervisor on a real local Ray: a trainer rank that dies stops the run with one line naming it, and the
calls its peers had in flight fail quietly afterwards (no "Unhandled error" traceback after that line)."""

from __future__ import annotations

import gc
import os
import time

import pytest
import ray

from coati.cluster.connect import where
from coati.cluster.supervision import RunStopped, Supervisor, memory_line, stuck_line as the_stuck_line


@ray.remote(num_cpus=0)
class Rank:
    def save(self, dies: bool) -> dict:
        if dies:
            time.sleep(0.3)
            os._exit(1)
        time.sleep(0.6)  # the peer's collective notices the lost rank
        raise RuntimeError("Read error: Connection reset by peer")


def unhandled_errors(monkeypatch) -> list:
    seen = []
    monkeypatch.setattr(ray._private.worker, "_unhandled_error_handler", seen.append)
    return seen


def stop_a_save(tmp_path, drain: bool) -> str:
    """rank 1 dies mid-save; rank 0's save fails 0.3 s later, before the driver kills it, as gloo's does."""
    ranks = [Rank.remote(), Rank.remote()]
    places = {"trainers": ray.get([rank.__ray_call__.remote(where) for rank in ranks])}
    supervisor = Supervisor(str(tmp_path), ranks, [], places)
    with pytest.raises(ray.exceptions.RayError) as failure:
        supervisor.gather([rank.save.remote(dies=(n == 1)) for n, rank in enumerate(ranks)])
    stopped = supervisor.stopped(failure.value)
    time.sleep(1.0)
    supervisor.kill_all()
    if drain:
        supervisor.drain()
    else:
        supervisor.in_flight = []
    assert isinstance(stopped, RunStopped)
    return str(stopped)


def settle() -> None:
    gc.collect()
    time.sleep(3.0)  # Ray reports an unfetched failure from a background thread once its ref is gone


def test_a_dead_rank_stops_the_run_with_one_line_and_its_peers_failures_stay_quiet(local_ray, tmp_path, monkeypatch):
    seen = unhandled_errors(monkeypatch)
    message = stop_a_save(tmp_path, drain=True)
    assert message.startswith("trainer rank 1 (pid ") and "died; the run stopped. No complete checkpoint" in message
    settle()
    assert seen == []


def test_an_undrained_peer_failure_is_what_ray_would_print_after_the_line(local_ray, tmp_path, monkeypatch):
    seen = unhandled_errors(monkeypatch)
    stop_a_save(tmp_path, drain=False)
    settle()
    assert any("Connection reset by peer" in str(error) for error in seen), seen


@ray.remote(num_cpus=0)
class Trainer:
    """A trainer rank's step as the buffer sees it: note the step begun, then draw (``begins``), or hang before
    either, as a rank stuck outside its step's collectives does."""

    def __init__(self, buffer, rank: int):
        self.buffer, self.rank = buffer, rank

    def step(self, begins: bool, hang_s: float = 0.0) -> int:
        if begins:
            self.buffer.note.remote(("trainer rank", self.rank), 1)
        time.sleep(hang_s)  # rank 1 hangs; rank 0 then "waits in the collective" for it
        return len(ray.get(self.buffer.get.remote(2, "draw0", 2))) if begins else 0


def stuck_line(tmp_path, buffer, trainers, steps) -> tuple[str, float]:
    """The gather of ``steps(trainers)`` past its bound: (its line, seconds until it raised)."""
    from coati.cluster.deadlines import Deadlines
    from coati.cluster.supervision import ActorStuck

    places = {"trainers": ray.get([t.__ray_call__.remote(where) for t in trainers]), "inferencers": [{}, {}]}
    supervisor = Supervisor(str(tmp_path), trainers, ["p0", "p1"], places, buffer, Deadlines(scale=0.001))
    supervisor.last_step = 4
    start = time.monotonic()
    with pytest.raises(ActorStuck) as stuck:
        supervisor.gather(steps(trainers), "step", "in step 5")
    seconds = time.monotonic() - start
    for trainer in trainers:
        ray.kill(trainer)
    return str(stuck.value), seconds


def test_a_step_waiting_for_a_missing_round_names_the_inferencer_generating_it(local_ray, tmp_path):
    from coati.cluster.buffer import RolloutBuffer

    buffer = ray.remote(RolloutBuffer).options(num_cpus=0).remote(2, {0: (0, 1), 1: (1, 1)})
    ray.get(buffer.put.remote(["g"], 0, 0))  # inferencer 1 never delivers round 0
    trainers = [Trainer.remote(buffer, rank) for rank in range(2)]
    line, seconds = stuck_line(tmp_path, buffer, trainers, lambda ts: [t.step.remote(True) for t in ts])
    assert line.startswith("inferencer 1 (pid ? on ? (node ?)) is stuck generating round 0: no answer within 1.8 s "
                           "(--wait-scale 0.001); last completed step 4; the run stopped. If the call is only slow, "
                           "raise --wait-scale. No complete checkpoint"), line
    assert "\n" not in line and 1.8 <= seconds < 1.8 + 10.0


def test_a_rank_that_never_begins_its_step_is_named_not_its_waiting_peer(local_ray, tmp_path):
    from coati.cluster.buffer import RolloutBuffer

    buffer = ray.remote(RolloutBuffer).options(num_cpus=0).remote(2, {0: (0, 2)})
    ray.get(buffer.put.remote(["g", "g"], 0, 0))  # the round is there: nothing waits for an inferencer
    trainers = [Trainer.remote(buffer, rank) for rank in range(2)]
    line, _ = stuck_line(tmp_path, buffer, trainers,
                         lambda ts: [ts[0].step.remote(True, 3600.0), ts[1].step.remote(False, 3600.0)])
    assert line.startswith("trainer rank 1 (pid "), line
    assert " is stuck before step 5 (its peers wait for it in the step's collectives): no answer within 1.8 s" in line


def test_one_function_writes_the_stuck_line_of_a_run_and_of_a_stage(tmp_path):
    """An RL run's Supervisor and an SFT/RM stage's ranks stop with the same line: who, doing what, how long the
    driver waited, the last completed step where the run knows it, what to change, how to continue."""
    from coati.utils.checkpoint import COMPLETE_MARKER

    run = the_stuck_line(["inferencer 0 (pid 7 on a (node b))"], "generating round 3", 300.0, 1.0, str(tmp_path),
                         last_step=6)
    assert run == ("inferencer 0 (pid 7 on a (node b)) is stuck generating round 3: no answer within 300.0 s "
                   "(--wait-scale 1); last completed step 6; the run stopped. If the call is only slow, raise "
                   f"--wait-scale. No complete checkpoint under {tmp_path} yet: start again (-si N saves one every N "
                   "steps).")
    (tmp_path / "step_4").mkdir()
    (tmp_path / "step_4" / COMPLETE_MARKER).write_text("{}")  # a complete checkpoint: the hint names it
    stage = the_stuck_line(["trainer rank 1", "trainer rank 3"], "in save", 12.34, 0.05, str(tmp_path), "stage")
    assert stage == ("trainer rank 1, trainer rank 3 are stuck in save: no answer within 12.3 s (--wait-scale 0.05); "
                     "the stage stopped. If the call is only slow, raise --wait-scale. Continue it with --resume "
                     f"{tmp_path / 'step_4'} (the newest complete checkpoint; or --resume latest).")


def test_a_memory_kill_is_one_line_with_the_nodes_numbers_and_what_to_lower(tmp_path):
    """Ray's memory monitor killing a trainer rank's call (Gemma 3 270M beside a busy machine) stops the run in one
    line: the node's memory, the run's knobs, the resume hint; never Ray's traceback."""
    import ray

    killed = ray.exceptions.OutOfMemoryError(
        "1 worker(s) were killed due to the node running low on memory. Memory on the node (IP: 192.0.2.2, ID: ab) "
        "was 22.44GB used / 23.54GB limit (0.953433)\nOOM kill reason: Memory usage 24044429312B exceeded ...")
    stopped = Supervisor(str(tmp_path), [], [], {}).stopped(killed)
    assert isinstance(stopped, RunStopped) and "\n" not in str(stopped)
    assert str(stopped).startswith("Ray's memory monitor killed an actor of the run: the node used 22.44 of 23.54 "
                                   "GB. Lower -tmbs")
    assert str(stopped).endswith("start again (-si N saves one every N steps).")
    assert memory_line("killed").startswith("the node ran out of memory. Lower -tmbs")


@ray.remote(num_cpus=0)
class Sleeper:
    def __init__(self, seconds: float):
        self.seconds = seconds

    def step(self) -> float:
        time.sleep(self.seconds)
        return self.seconds


def test_a_stage_rank_that_does_not_answer_stops_the_stage_in_one_line_naming_it(local_ray, tmp_path):
    """An SFT/RM stage of -t > 1 ranks waits for each call within its bound (deadlines.py), like an RL run: rank 1
    never answering its step is named in one line; the call that answered in time sets the kind's later bound."""
    from coati.cluster.deadlines import Deadlines
    from coati.cluster.supervision import ActorStuck
    from coati.cluster.trainer_group import RanksStuck, TrainerGroup
    from coati.launcher.stage import _Group

    def started(*seconds) -> TrainerGroup:  # the bound is for a call, not for Ray starting its processes
        actors = [Sleeper.remote(s) for s in seconds]
        ray.get([actor.__ray_ready__.remote() for actor in actors])
        return TrainerGroup(actors)

    deadlines = Deadlines(scale=1.0, start_s=3.0)
    group = started(0.1, 0.1)
    assert group.call("step", deadlines=deadlines) == [0.1, 0.1]
    assert 0.1 <= deadlines.slowest["step"] < 3.0
    group.kill()
    group = started(0.0, 60.0)
    with pytest.raises(RanksStuck) as stuck:
        group.call("step", deadlines=Deadlines(scale=1.0, start_s=2.0))
    assert (stuck.value.ranks, stuck.value.method, stuck.value.bound) == ([1], "step", 2.0)

    stage = _Group.__new__(_Group)  # the stage's ranks as run_stage holds them, without a model to train
    stage.ray, stage.stuck, stage.group, stage.run_dir = True, False, group, str(tmp_path)
    stage.deadlines = Deadlines(scale=0.5, start_s=2.0)
    with pytest.raises(ActorStuck) as line:
        stage.call("step")
    assert str(line.value) == (f"trainer rank 1 is stuck in step: no answer within 1.0 s (--wait-scale 0.5); the "
                               f"stage stopped. If the call is only slow, raise --wait-scale. No complete checkpoint "
                               f"under {tmp_path} yet: start again (-si N saves one every N steps).")
    assert stage.stuck  # its close kills the ranks without asking the stuck one to shut down
    group.kill()
