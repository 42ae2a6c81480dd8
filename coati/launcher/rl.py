"""Builds the Ray actors for a run, wires buffer and weight sync, drives training and evaluation.

The driver only orchestrates: producers run their own generation loop; the driver's run loop (run_loop.py)
calls ``step()`` on the trainers and hands what they return to this run's hooks: the metrics log, the health
monitors, the weight-delivery check, the -rsd rollout logs, held-out evaluation at step 0, every -ei steps and at
the end (eval_schedule.py), the progress bar and the -si checkpoints.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import asdict, dataclass, field

import ray

from coati.cluster.buffer import RolloutBuffer
from coati.cluster.connect import PLACEMENT_TIMEOUT_S, Reservation, init_ray_for, node_label, where
from coati.cluster.connect import reserve as reserve_placement
from coati.cluster.schedule import node_cores, node_thread_budgets, thread_budgets
from coati.cluster.deadlines import Deadlines
from coati.cluster.supervision import PRODUCER_OPTIONS, ActorStuck, Supervisor
from coati.cluster.trainer_group import TrainerGroup, join_trainer_group, start_trainer_group
from coati.cluster.weight_store import WeightStore
from coati.config.colocation import choose_colocation
from coati.config.lora_sync import choose_lora_sync
from coati.config.tree import RLConfig
from coati.launcher.eval_schedule import EvalSchedule
from coati.launcher.delivery import DeliveryCheck, WeightsNotDelivered
from coati.launcher.health import run_monitors
from coati.launcher.plan import evaluates_apart, fit_for_start
from coati.rollout.producer import Producer
from coati.launcher.checkpoints import (
    NothingToResume,
    check_resume,
    nothing_left_line,
    restore_run,
    save_checkpoint,
    trim_metrics,
)
from coati.launcher.run_loop import Every, HealthChecks, Hook, MetricsRows, ProgressBar, RunLoop
from coati.launcher.stop import RunInterrupted, StopRequest
from coati.trainer.consumer import Consumer
from coati.utils.checkpoint import prune_checkpoints
from coati.utils.machine import bf16_cpu_line, cpu_flags, usable_cores
from coati.utils.metrics import MetricsLogger
from coati.utils.run_files import RolloutWriter
from rewards.correctness import accuracy_text


@dataclass
class RunResult:
    steps: int
    eval_before: dict  # "task/sampling" -> accuracy (None: no reward of the run defines correctness)
    eval_after: dict
    final_model_dir: str
    metrics_path: str
    wall_s: float
    reward_before: dict = field(default_factory=dict)  # "task/sampling" -> held-out mean reward
    reward_after: dict = field(default_factory=dict)


def init_ray(config: RLConfig) -> None:
    """Join the run's cluster (--master_address, RAY_ADDRESS) or start a local one with a slot per actor."""
    p = config.parallel
    init_ray_for(p.num_inferencers + p.num_trainers, config.run.master_address, config.run.ray_dir)


def reserve(config: RLConfig, timeout_s: float = PLACEMENT_TIMEOUT_S) -> Reservation:
    """The run's placement groups (coati.cluster.connect.reserve), the evaluator's when it evaluates apart."""
    p = config.parallel
    return reserve_placement(p.num_inferencers, p.producer_tensor_parallel_size, p.num_trainers,
                             evaluates_apart(config), timeout_s)


def run(config: RLConfig, log=print, start_lines: tuple[str, ...] = ()) -> RunResult:
    """Train on the cluster ``init_ray`` picks; a dead trainer rank (or an inferencer past its restarts)
    raises supervision.RunStopped, whose message says how to continue. ``start_lines`` (the engine chosen and
    why) are logged once the cluster is joined, so a cluster that cannot be joined is one error line alone."""
    from tqdm import tqdm

    start = time.time()
    if log is print:  # lines printed while the progress bar is up go above it, not through it
        log = tqdm.write
    with StopRequest(config.run.run_dir) as stop:  # SIGINT/SIGTERM: stop.py
        try:
            init_ray(config)
            stop.reclaim()
            for line in start_lines:
                log(line)
            config, line = choose_colocation(config, ray.cluster_resources().get("GPU", 0))
            if line:
                log(line)
            config, line = choose_lora_sync(config, ray.cluster_resources().get("GPU", 0))
            if line:
                log(line)
            line = bf16_cpu_line(config.parallel.precision, ray.cluster_resources().get("GPU", 0), cpu_flags())
            if line:
                log(line)
            # before any actor: a cluster too small for the flags is one ClusterError line
            reservation = reserve(config)
            try:
                fit = fit_for_start(config)  # before any actor: flags that cannot fit are one PlanError line
                if fit.line:
                    log(fit.line)
                return _run(fit.config, log, reservation, start, stop)
            finally:
                reservation.release()
        except KeyboardInterrupt:
            if stop.requested is None:
                raise
            raise stop.interrupted() from None  # before the training loop: nothing trained, nothing to save


def _run(config: RLConfig, log, reservation, start: float, stop: StopRequest) -> RunResult:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    p, schedule = config.parallel, config.schedule
    here = ray.get_runtime_context().get_node_id()
    # Thread budgets per node: each actor shares the cores of the node it was placed on (nodes differ).
    cores = node_cores(reservation.node_cpus, here, usable_cores())
    producer_threads, trainer_threads = node_thread_budgets(cores, reservation.inferencer_nodes,
                                                            reservation.trainer_nodes, schedule.is_async)
    evaluator_threads = _evaluator_threads(cores, reservation.evaluator_node or here, reservation, schedule.is_async)
    # Buffer and weight store hold the run's state: they stay with the driver, not on a node that may go away.
    beside_driver = {"num_cpus": 0, "scheduling_strategy": NodeAffinitySchedulingStrategy(here, soft=False)}
    names = {role: f"coati-{role}-{uuid.uuid4().hex[:12]}" for role in ("weights", "buffer")}  # for the producers
    store = ray.remote(WeightStore).options(name=names["weights"], **beside_driver).remote()
    buffer = ray.remote(RolloutBuffer).options(name=names["buffer"], **beside_driver).remote(
        schedule.buffer_capacity, schedule.slots())
    consumers = start_trainer_group(Consumer, p.num_trainers, dict(config=config, buffer=buffer, weight_store=store),
                                    trainer_threads, reservation.trainer_options).actors
    producers = [ray.remote(Producer).options(**reservation.inferencer_options(rank), **PRODUCER_OPTIONS).remote(
        config, rank, names["buffer"], names["weights"], producer_threads[rank]) for rank in range(p.num_inferencers)]
    try:
        places = {"trainers": ray.get([actor.__ray_call__.remote(where) for actor in consumers]),
                  "inferencers": ray.get([actor.__ray_call__.remote(where) for actor in producers])}
    except KeyboardInterrupt:  # a stop while they load: ended here, before their placement groups go
        Supervisor(config.run.run_dir, consumers, producers, {}).kill_all()
        raise
    for role, threads in (("trainers", trainer_threads), ("inferencers", producer_threads)):
        for place, count in zip(places[role], threads):
            place["threads"] = count
    _record_placement(config, reservation, places, log)
    # a reward server's tries must be able to end (and say so) before the driver blames the producer around them
    deadlines = Deadlines(config.run.wait_scale, least_s=2 * config.data.reward_url_give_up_s)
    supervisor = Supervisor(config.run.run_dir, consumers, producers, places, buffer, deadlines)
    try:
        return _train(config, log, start, consumers, producers, buffer, supervisor, evaluator_threads, reservation,
                      stop)
    except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError, ray.exceptions.OutOfMemoryError) as err:
        stopped = supervisor.stopped(err)
        if stopped is err:
            raise
        supervisor.kill_all()
        supervisor.drain()
        raise stopped from None
    except ActorStuck:  # the stuck actor would never end a cancelled call: kill at once
        supervisor.cancel_generation(timeout=0)
        supervisor.kill_all()
        supervisor.drain()
        raise
    except (KeyboardInterrupt, RunInterrupted, WeightsNotDelivered):
        # Ended for good before their placement groups go: a producer removed with its group would be restarted
        # (and say so), and a failure nobody fetched would print a traceback after the stop's line.
        supervisor.cancel_generation()
        supervisor.kill_all()
        supervisor.drain()
        raise


def _train(config, log, start, consumers, producers, buffer, supervisor, evaluator_threads, reservation,
           stop: StopRequest) -> RunResult:
    from tqdm import tqdm

    join_trainer_group(TrainerGroup(consumers), supervisor.gather)
    log(supervisor.gather([consumers[0].micro_batching_line.remote()])[0])
    rounds, engine_precisions = _rounds_to_run(config, consumers, producers, log)
    rounds, total_groups = config.run_length(rounds)
    # Every trainer rank draws its share of all rounds (or of --max-steps steps); a step returns None once its
    # share is used up. Without filtering that is exactly total_groups / (dp * tbs) steps; with it (DAPO), fewer.
    max_steps = total_groups // (config.parallel.dp_size * config.batch.train_batch_size)
    supervisor.gather([consumer.set_total_groups.remote(total_groups) for consumer in consumers])

    resume = check_resume(config) if config.run.resume else None
    state = restore_run(resume, consumers, buffer, supervisor.gather) if resume else None
    if resume and trim_metrics(config.run.run_dir, state["step"]):
        log(f"metrics.jsonl: dropped the rows after step {state['step']}, which this resumed run redoes")
    logger, evals, rollouts = _open_outputs(config, log, producers, consumers, resume, state, evaluator_threads,
                                            reservation, lambda refs: supervisor.gather(refs, "evaluation",
                                                                                        "evaluating"))
    start_rounds = state["producer_rounds"] if resume else [0] * len(producers)
    supervisor.watch([producer.run.remote(rounds, begin) for producer, begin in zip(producers, start_rounds)])
    first, skipped = (state["step"], state["skipped"]) if resume else (0, 0)
    supervisor.last_step = first
    # (path, skipped steps) of the newest checkpoint of this state: the final save does not repeat it
    last_saved = (os.path.join(config.run.run_dir, f"step_{first}"), skipped) if resume else None

    def step(done: int) -> dict | None:
        return rollouts.take(supervisor.gather([consumer.step.remote() for consumer in consumers], "step",
                                               f"in step {done + 1}")[0])

    def save(at_step: int) -> str:
        nonlocal last_saved
        path = os.path.join(config.run.run_dir, f"step_{at_step}")
        if (path, loop.skipped) != last_saved or not os.path.isdir(path):
            save_checkpoint(path, consumers, buffer, config,
                            {"step": at_step, "skipped": loop.skipped, "eval_before": evals.before_accuracy(),
                             "eval_reward_before": evals.before_mean_reward()},
                            lambda refs: supervisor.gather(refs, "save", f"saving step {at_step}"))
            if config.run.keep_checkpoints:
                prune_checkpoints(config.run.run_dir, config.run.keep_checkpoints, path)
        last_saved = (path, loop.skipped)
        return path

    health = HealthChecks(run_monitors(config), logger, log)
    evals.watch(lambda at_step, row: health.feed(at_step, {**row, "kind": "eval"}))
    bar = tqdm(total=max_steps, initial=first, desc=config.algo.name, unit="step", disable=not config.run.progress_bar)
    hooks = [Hook(after_step=lambda at_step, row: setattr(supervisor, "last_step", at_step)),
             MetricsRows(logger), health,
             Hook(after_skip=lambda at_step, row: log(
                 f"after step {at_step}: a step was skipped: {row['skipped']} "
                 f"(groups drawn {row['groups_drawn']}, weights v{row['weight_version']})")),
             _DeliveryHook(DeliveryCheck.of(config, engine_precisions), save, evals, logger, log),
             rollouts, _EvalHook(evals),
             ProgressBar(bar, lambda row: dict(reward=f"{row['reward']:.3f}", acc=accuracy_text(row.get("accuracy")),
                                               loss=f"{row['loss']:.4f}", v=row["weight_version"])),
             Every(config.run.save_interval, save)]
    with RunLoop(stop, step, save, hooks) as loop:
        total_steps = loop.run(first, skipped)  # a stop raises RunInterrupted after its checkpoint
        bar.close()
        if resume and not loop.calls:
            # the first step found no group left (a finished run resumed): one line, not a second final evaluation
            evals.settle()
            supervisor.kill_all()
            raise NothingToResume(nothing_left_line(resume, total_steps))
        supervisor.wait_generation()  # every producer's run() has returned
        if loop.skipped:
            log(f"{loop.skipped} steps were skipped because no group survived the filter")
        eval_before, eval_after = evals.finish(total_steps)
        rollouts.close()
        final_dir = save(total_steps)
        supervisor.gather([consumer.shutdown.remote() for consumer in consumers])
        # Their work is done: end them now, not by the SIGTERM of Ray's shutdown, which can land in an actor
        # handle's __del__ and print a SystemExit traceback after the results.
        supervisor.kill_all()
    return RunResult(total_steps, eval_before, eval_after, final_dir, logger.path, time.time() - start,
                     evals.mean_reward.get(0, {}), evals.mean_reward.get(total_steps, {}))


class _DeliveryHook(Hook):
    """--delivery-check: a trained step whose rows show weights the engines did not get stops the run after saving
    it (the trainer's weights are right, the engines' were not), or is one warning line and a "health" row."""

    def __init__(self, delivery: DeliveryCheck, save, evals: EvalSchedule, logger, log):
        self.delivery, self.save, self.evals, self.logger, self.log = delivery, save, evals, logger, log

    def after_step(self, step: int, row: dict) -> None:
        problem = self.delivery.problem(step, row)
        if problem and self.delivery.stops:
            path = self.save(step)
            self.evals.settle()
            raise WeightsNotDelivered(f"{problem}; the run stopped after saving {path}")
        if problem:
            self.log(f"warning: {problem}")
            self.logger.log(step, {"monitor": "delivery", "metric": "delivery_gap", "first_step": step,
                                   "last_step": step, "message": problem}, kind="health")


class _EvalHook(Hook):
    """Held-out evaluation every -ei trained steps, collected between steps without waiting (eval_schedule.py); a
    stop waits for those in flight."""

    def __init__(self, evals: EvalSchedule):
        self.evals = evals

    def after_step(self, step: int, row: dict) -> None:
        if self.evals.due(step):
            self.evals.submit(step)
        self.evals.poll()

    def settle(self) -> None:
        self.evals.settle()


class _Rollouts(Hook):
    """-rsd: trainer rank 0's records of each step's samples, taken out of the step's row before it is logged."""

    def __init__(self, writer: RolloutWriter | None):
        self.writer, self.records = writer, None

    def take(self, row: dict | None) -> dict | None:
        self.records = row.pop("rollouts", None) if row is not None else None
        return row

    def after_step(self, step: int, row: dict) -> None:
        if self.records and self.writer is not None:
            self.writer.write(step, self.records)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def _open_outputs(config, log, producers, consumers, resume, state, evaluator_threads, reservation, gather):
    """The run's metrics log, evaluation schedule (its first evaluation submitted, or restored when resuming)
    and rollout writer (-rsd)."""
    logger = MetricsLogger(config.run.run_dir, config.run.project, _jsonable(config), log, resume=bool(resume))
    evals = EvalSchedule(config, producers[0] if producers else None, consumers, logger, gather, log,
                         num_threads=evaluator_threads,
                         resume=bool(resume), actor_options=reservation.evaluator_options())
    rollouts = _Rollouts(None)
    if config.run.rollout_save_dir:
        rollouts = _Rollouts(RolloutWriter(os.path.join(config.run.rollout_save_dir, config.run.project), log=log,
                                           resume=bool(resume)))
    if resume:
        log(f"resuming from {resume}: step {state['step']}, weights v{state['policy_version']}, "
            f"{state['pending_groups']} pending groups, producers from rounds {state['producer_rounds']}")
        evals.restore_before(state["eval_before"], state.get("eval_reward_before"))
    else:
        evals.submit(0)
    return logger, evals, rollouts


def _rounds_to_run(config, consumers, producers, log) -> int:
    """Rounds of the whole run: the shortest shard's rounds per episode (producers', the sending trainer's with
    --learner-chunk-size, every trainer rank's with --colocate) times the episodes; and the precisions the
    inferencers' engines compute in."""
    trainer = "learner" if config.algo.learner_chunk_size else "trainer rank"
    infos = {f"inferencer {rank}": info for rank, info in enumerate(ray.get([p.info.remote() for p in producers]))}
    infos.update({f"{trainer} {rank}": info for rank, info in
                  enumerate(ray.get([consumer.learner_info.remote() for consumer in consumers])) if info})
    for name, info in infos.items():
        if info["skipped_too_long"]:
            log(f"{name}: skipped {info['skipped_too_long']} prompts longer than -mpt tokens")
    rounds = min(info["rounds_per_episode"] for info in infos.values()) * config.run.num_episodes
    if rounds == 0:
        raise RuntimeError("no full inference batch of prompts fits -mpt; raise -mpt/--max-prompt-tokens or lower -ibs")
    return rounds, [info["engine_precision"] for info in infos.values() if "engine_precision" in info]


def _evaluator_threads(cores: dict[str, int], node: str, reservation, concurrent: bool) -> int:
    """The evaluator runs beside training on ``node`` (its bundle's on GPU clusters; on CPU clusters it has no
    slot and stays with the driver): half that node's cores in sync mode, a producer's share in async mode."""
    if not concurrent:
        return max(1, cores[node] // 2)
    return thread_budgets(cores[node], reservation.inferencer_nodes.count(node), reservation.trainer_nodes.count(node),
                          concurrent=True)[0]


def _record_placement(config: RLConfig, reservation, places: dict, log) -> None:
    """<run dir>/placement.json: each actor's node, IP, pid and GPUs; one log line when the run spans nodes."""
    os.makedirs(config.run.run_dir, exist_ok=True)
    with open(os.path.join(config.run.run_dir, "placement.json"), "w") as handle:
        json.dump({"unit": reservation.plan.unit, **places}, handle, indent=1)
    nodes = {place["node_id"] for role in places.values() for place in role}
    if len(nodes) > 1:
        def summary(role: str, name: str) -> str:
            by_node: dict[str, list[int]] = {}
            for rank, place in enumerate(places[role]):
                by_node.setdefault(node_label(place), []).append(rank)
            return "; ".join(f"{name} {_ranks(ranks)} on {node}" for node, ranks in by_node.items())

        log(f"{len(nodes)} nodes: {summary('trainers', 'trainer ranks')}; {summary('inferencers', 'inferencers')}")


def _ranks(ranks: list[int]) -> str:
    return f"{ranks[0]}-{ranks[-1]}" if len(ranks) > 1 and ranks == list(range(ranks[0], ranks[-1] + 1)) \
        else ",".join(map(str, ranks))


def _jsonable(config: RLConfig) -> dict:
    return json.loads(json.dumps(asdict(config), default=str))
