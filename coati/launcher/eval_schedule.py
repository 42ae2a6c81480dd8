"""Driver side of held-out evaluation: which steps are evaluated, on which weights, and where results go.

Steps evaluated: 0 (the initial model), every ``-ei`` trained steps (skipped DAPO steps do not count:
the step counter only moves on a trained step), and the last step, once even when it is also a multiple of
``-ei``; with ``-ei`` larger than the run that is just 0 and the end.

Weights an eval at step N sees (recorded in every result as ``step``, ``version`` and ``on_sync``):
- ``-ei > 0`` (evaluator actor, see evaluator.py): exactly the trainer's weights after N trained steps,
  snapshotted by the driver between step N and step N+1. ``version`` is the newest published weight
  version at that moment; ``on_sync`` is true when the snapshot *is* that version (step N ended a round:
  N a multiple of steps_per_sync without filtering), false when it holds training past it (the producers
  will receive those weights with the next version).
- ``-ei 0``: producer 0 evaluates before training (the initial model, version 0) and after it (the last
  published version, which is the final weights: the trainer publishes after the step that draws the last
  round).

Results arrive from the evaluator in submission order; the driver collects them between training steps
without waiting (``poll``), logs them (metrics.jsonl, kind "eval") in step order and writes the records and
summary.json through ``EvalWriter``. At most ``MAX_PENDING`` steps' evals are in flight; beyond that the
driver waits for the oldest (bounded memory for weight snapshots). ``finish`` evaluates the last step and
waits for everything; nothing the evaluator runs waits on producers or trainers, so this always returns.
"""

from __future__ import annotations

import os
from collections import deque

import ray

from coati.config.tree import RLConfig
from coati.launcher.plan import evaluates_apart
from coati.rollout.evaluation import EVAL_NUMBERS
from rewards.correctness import NOT_DEFINED
from coati.rollout.evaluator import MAX_PENDING, Evaluator
from coati.utils.run_files import EvalWriter


def eval_dir(config: RLConfig) -> str:
    """``-esd DIR``: DIR/<project>/; default <save-dir>/<project>/eval."""
    run = config.run
    return os.path.join(run.eval_save_dir, run.project) if run.eval_save_dir else os.path.join(run.run_dir, "eval")


def eval_line(step: int, name: str, out: dict, on_sync: bool, show_format: bool) -> str:
    """The console line of one evaluation result. The built-in reward's format rate is shown only when that
    reward counts (``show_format``): with its weight 0 (a user reward defines success) it is noise."""
    if out.get("accuracy") is not None:
        numbers = f"accuracy {out['accuracy']:.3f}"
    else:  # the built-in verdict is no accuracy of this run's: say so, and what rose instead
        numbers = f"accuracy {NOT_DEFINED}, mean reward {out['mean_reward']:.3f}"
    if show_format:
        numbers += f" format {out['format_rate']:.3f}"
    if "rm_score" in out:
        numbers += f" reward-model score {out['rm_score']:.3f}"
    if "tool_use_rate" in out:
        numbers += f" tool use {out['tool_use_rate']:.3f}"
    where = f"weights v{out['version']}" + ("" if on_sync else f" + training to step {step}")
    return f"eval step {step} {name}: {numbers} (n={out['count']}, {where})"


class EvalSchedule:
    def __init__(self, config: RLConfig, producer, consumers, logger, gather, log=print, num_threads: int = 1,
                 resume: bool = False, actor_options: dict | None = None):
        self.config, self.producer, self.consumers, self.logger, self.log = config, producer, consumers, logger, log
        self.gather = gather  # waits for the trainer ranks' (collective) snapshot calls: the run's supervisor
        self.jobs = [(task, path, mode, params) for task, path in config.data.eval_paths.items()
                     for mode, params in config.eval_sampling]
        self.interval = config.run.eval_interval
        self.writer = EvalWriter(eval_dir(config), log, resume=resume) if self.jobs else None
        self.evaluator = None
        self.on_trainers = bool(config.parallel.colocate)  # the trainer ranks' own engines evaluate
        if evaluates_apart(config):
            # Default num_cpus=0: it shares the cores with producers and trainers (as buffer and store do), so the
            # run needs no extra Ray CPU slot and cannot wait for one; GPU clusters give it a bundle (placement.py).
            self.evaluator = ray.remote(Evaluator).options(**(actor_options or {"num_cpus": 0})).remote(
                config, num_threads)
        self.pending: deque = deque()  # (step, on_sync, [(task, mode, ObjectRef)]) in submission order
        self.submitted: set[int] = set()
        # step -> "task/mode" -> accuracy (None: no reward defines correctness) and mean reward
        self.accuracy: dict[int, dict[str, float | None]] = {}
        self.mean_reward: dict[int, dict[str, float]] = {}
        self.rows: list[tuple[int, dict]] = []  # (step, row) of every row logged, for ``watch``
        self.on_row = None

    def restore_before(self, accuracy: dict[str, float | None], mean_reward: dict[str, float] | None = None) -> None:
        """A resumed run: step 0 was evaluated by the run that wrote the checkpoint; keep its numbers (checkpoints
        from before mean rewards were kept have none)."""
        self.submitted.add(0)
        self.accuracy[0] = dict(accuracy)
        self.mean_reward[0] = dict(mean_reward or {})

    def watch(self, on_row) -> None:
        """Call ``on_row(step, row)`` with every row logged, the rows logged so far first (the driver's run-health
        check, which starts after step 0's evaluation may have been logged)."""
        for step, row in self.rows:
            on_row(step, row)
        self.on_row = on_row

    def before_accuracy(self) -> dict[str, float | None]:
        """Step 0's accuracies, waiting for them if still in flight (a checkpoint stores them for resume)."""
        while self.pending and self.pending[0][0] == 0:
            self._collect_oldest()
        return self.accuracy.get(0, {})

    def before_mean_reward(self) -> dict[str, float]:
        self.before_accuracy()
        return self.mean_reward.get(0, {})

    def due(self, step: int) -> bool:
        return self.interval > 0 and step % self.interval == 0

    def submit(self, step: int) -> None:
        """Evaluate the current weights as those of ``step``; call only between training steps."""
        if not self.jobs or step in self.submitted:
            return
        self.submitted.add(step)
        if self.on_trainers:  # --colocate: between two steps the trainer ranks are free; exact weights of `step`
            for task, path, mode, params in self.jobs:
                out = self.gather([consumer.evaluate.remote(path, params) for consumer in self.consumers])[0]
                self._record(step, task, mode, out, out.pop("on_sync"))
            return
        if self.evaluator is None:  # -ei 0: producer 0, which is idle before and after training
            for task, path, mode, params in self.jobs:
                self._record(step, task, mode, ray.get(self.producer.evaluate.remote(path, params)), True)
            return
        if step == 0:
            version, refs, on_sync = 0, None, True  # the evaluator starts from the same initial model
        else:
            snapshots = self.gather([consumer.snapshot_weights.remote() for consumer in self.consumers])
            version, on_sync = snapshots[0][0], snapshots[0][2]
            refs = next(refs for _, refs, _ in snapshots if refs is not None)
        futures = [(task, mode, self.evaluator.evaluate.remote(step, version, refs, task, mode, params))
                   for task, _, mode, params in self.jobs]
        self.pending.append((step, on_sync, futures))
        while len(self.pending) > MAX_PENDING:
            self._collect_oldest()

    def poll(self) -> None:
        """Log every finished step's results, oldest first, without waiting."""
        while self.pending:
            refs = [ref for _, _, ref in self.pending[0][2]]
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            if len(ready) < len(refs):
                return
            self._collect_oldest()

    def finish(self, last_step: int) -> tuple[dict, dict]:
        """Evaluate ``last_step`` (unless done), wait for every result; (accuracies at 0, at last_step)."""
        self.submit(last_step)
        self.settle()
        return self.accuracy.get(0, {}), self.accuracy.get(last_step, {})

    def settle(self) -> None:
        """Wait for (and log) every evaluation submitted, then end the evaluator: its model is freed before the
        final save (or a stop's)."""
        while self.pending:
            self._collect_oldest()
        if self.evaluator is not None:
            ray.kill(self.evaluator)
            self.evaluator = None

    def _collect_oldest(self) -> None:
        step, on_sync, futures = self.pending.popleft()
        for task, mode, ref in futures:
            self._record(step, task, mode, ray.get(ref), on_sync)

    def _record(self, step: int, task: str, mode: str, out: dict, on_sync: bool) -> None:
        summary = {**{name: out[name] for name in EVAL_NUMBERS if name in out},
                   "count": out["count"], "version": out["version"], "on_sync": on_sync}
        name = self.writer.write(step, task, mode, out["records"], summary)
        row = {"task": task, "mode": mode, **summary, "file": name}
        self.logger.log(step, row, kind="eval")
        self.accuracy.setdefault(step, {})[f"{task}/{mode}"] = out.get("accuracy")
        self.mean_reward.setdefault(step, {})[f"{task}/{mode}"] = out.get("mean_reward")
        self.log(eval_line(step, f"{task}/{mode}", out, on_sync, self.config.data.builtin_reward_counts))
        self.rows.append((step, row))
        if self.on_row is not None:
            self.on_row(step, row)
