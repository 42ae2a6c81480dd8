"""One supervised stage (``coati sft`` / ``coati rm``), the driver's side: the trainer ranks, the hooks it gives
the run loop (run_loop.py: metrics, the gradient-spike warning, progress bar, -ei evaluations, -si checkpoints;
a signal's stop), and the final model.

``run_stage`` runs one ``StageRank`` (coati/trainer/stage_rank.py) in-process, or ``-t`` of them as Ray
actors (a local cluster, or the one RAY_ADDRESS names), and writes ``metrics.jsonl`` and the final HF directory
``<save-dir>/<project>/final`` (``from_pretrained`` loads it; the reward model with
``AutoModelForSequenceClassification``).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass

from coati.cluster.connect import init_ray_for
from coati.cluster.deadlines import Deadlines
from coati.cluster.supervision import ActorStuck, stuck_line
from coati.cluster.trainer_group import (RanksStuck, even_threads, join_trainer_group, one_unit_each,
                                         start_trainer_group)
from coati.config.errors import ConfigError
from coati.config.stage import StageConfig
from coati.launcher import stage_checkpoint
from coati.launcher.checkpoints import trim_metrics
from coati.launcher.health import stage_monitors
from coati.launcher.run_loop import Every, HealthChecks, MetricsRows, ProgressBar, RunLoop
from coati.launcher.stop import StopRequest
from coati.trainer.stage_rank import StageRank


@dataclass
class StageResult:
    steps: int
    before: dict  # held-out metrics before training
    after: dict
    losses: list  # training loss of every step
    model_dir: str
    metrics_path: str
    data: dict  # row counts
    wall_s: float


class _Group:
    """The trainer ranks: one in-process StageRank, or -t Ray actors called in lockstep."""

    def __init__(self, config: StageConfig, train_path: str, eval_path: str | None, model_path: str):
        self.ray, self.stuck = config.num_trainers > 1, False
        if not self.ray:
            self.ranks = [StageRank(config, train_path, eval_path, model_path)]
            self.info = self.ranks[0].setup()
            return
        n = config.num_trainers
        init_ray_for(n)  # a local cluster, or the one RAY_ADDRESS names
        self.group = start_trainer_group(StageRank, n, dict(config=config, train_path=train_path, eval_path=eval_path,
                                                               model_path=model_path, actor=True),
                                         even_threads(n), one_unit_each(n))
        self.ranks = self.group.actors
        self.run_dir = config.run_dir
        self.deadlines = Deadlines(config.wait_scale)  # every wait of the driver for its ranks has a bound
        try:
            self.info = join_trainer_group(self.group)[0]
        except BaseException:
            self.group.kill()
            raise

    def call(self, method: str, *args):
        """Every rank's result of ``method(*args)`` (collective calls reach all ranks together); ranks that do not
        answer within the call's bound stop the stage: ``ActorStuck``, one line naming them."""
        if not self.ray:
            return [getattr(self.ranks[0], method)(*args)]
        try:
            return self.group.call(method, *args, deadlines=self.deadlines)
        except RanksStuck as stuck:
            self.stuck = True
            raise ActorStuck(stuck_line([f"trainer rank {rank}" for rank in stuck.ranks], f"in {stuck.method}",
                                        stuck.bound, self.deadlines.scale, self.run_dir, "stage")) from None

    def close(self) -> None:
        if not self.stuck:  # a stuck rank would never answer its shutdown
            self.call("shutdown")
        if self.ray:
            self.group.kill()


def run_stage(config: StageConfig, train_path: str, eval_path: str | None, model_path: str, log=print) -> StageResult:
    """Train the stage (from ``--resume``'s checkpoint when given) and save the final model; metrics go to
    <run_dir>/metrics.jsonl. SIGINT/SIGTERM stop it at a step boundary with a checkpoint: ``RunInterrupted``
    (run_loop.py, stop.py)."""
    from tqdm import tqdm

    from coati.utils.checkpoint import prune_checkpoints
    from coati.utils.metrics import MetricsLogger

    start = time.time()
    if log is print:  # lines printed while the progress bar is up go above it
        log = tqdm.write
    resume = stage_checkpoint.resume_point(config)
    os.makedirs(config.run_dir, exist_ok=True)
    if resume and trim_metrics(config.run_dir, stage_checkpoint.read_state(resume)["step"]):
        log("metrics.jsonl: dropped the rows after the checkpoint's step, which this resumed run redoes")
    group = None
    with StopRequest(config.run_dir) as stop:  # before the loop a signal ends the stage at once: nothing to save
        try:
            group = _Group(config, train_path, eval_path, model_path)
            stop.reclaim()  # ray.init (-t > 1) sets its own SIGTERM handler
            info, steps = group.info, group.info["steps"]
            _check_start(config, info, train_path, log)
            first, before = 0, {}
            if resume:
                state = stage_checkpoint.restore(group, resume)
                log(f"resuming from {resume}: step {state['step']} of {steps}")
                first, before = state["step"], state["before"]
            logger = MetricsLogger(config.run_dir, config.project or config.stage, asdict(config), log=log,
                                   resume=bool(resume))

            def evaluate(step: int) -> dict:
                return _evaluate(group, config, logger, log, step)

            def save(step: int) -> str:  # a new checkpoint replaces the previous one (the final model is apart)
                path = stage_checkpoint.save(group, config, step, before)
                prune_checkpoints(config.run_dir, 1, path)
                return path

            bar = tqdm(total=steps, initial=first, desc=config.stage, disable=not config.progress_bar, leave=False)
            health = stage_monitors(config.health_settings, config.lr, config.max_grad_norm)
            hooks = [MetricsRows(logger), HealthChecks(health, logger, log),
                     ProgressBar(bar, lambda row: {"loss": f"{row['loss']:.4f}"}),
                     # the last step's evaluation and model are the stage's end, not a checkpoint's
                     Every(config.eval_interval, evaluate, before=steps),
                     Every(config.save_interval, save, before=steps)]
            with RunLoop(stop, lambda step: group.call("step", step)[0], save, hooks) as loop:
                if not resume:
                    before = evaluate(0)
                loop.run(first, last=steps)
                bar.close()
                after = evaluate(steps)
                model_dir = os.path.join(config.run_dir, "final")
                group.call("save_pretrained", model_dir)
                with open(os.path.join(config.run_dir, "stage_config.json"), "w") as handle:
                    json.dump({**asdict(config), "model_path": model_path, "train_path": train_path,
                               "eval_path": eval_path}, handle, indent=1)
        except KeyboardInterrupt:
            if stop.requested is None:
                raise
            raise stop.interrupted() from None  # before the loop: nothing trained, nothing to save
        finally:
            if group is not None:
                group.close()
    losses = stage_checkpoint.earlier_losses(logger.path)  # a resumed run's too
    return StageResult(steps, before, after, losses, model_dir, logger.path, info, time.time() - start)


def _check_start(config: StageConfig, info: dict, train_path: str, log) -> None:
    log(f"{config.stage}: {info['train_rows']} training rows, {info['eval_rows']} held out"
        + (f", {info['skipped_too_long']} skipped as longer than -ml {config.max_length}"
           if info["skipped_too_long"] else "") + f"; {info['steps']} steps on {config.plugin_name} "
        f"x{config.num_trainers}")
    if info["steps"] == 0:
        raise ConfigError(f"{train_path}: {info['train_rows']} usable training rows, fewer than one batch of "
                          f"-bs {config.batch_size}; lower -bs or add rows")


def _evaluate(group: _Group, config: StageConfig, logger, log, step: int) -> dict:
    result = next((r for r in group.call("evaluate") if r is not None), None) or {}
    if result:
        # kind "eval" rows name metrics without the prefix (coati plot draws their accuracy)
        logger.log(step, {"task": config.stage, "mode": "held_out",
                          **{k.removeprefix("eval_"): v for k, v in result.items()}}, kind="eval")
        log(f"eval step {step}: " + ", ".join(f"{k} {v:.4f}" for k, v in result.items()))
    return result
