"""The one training loop of every command: ``coati train`` (RL, launcher/rl.py) and the supervised stages
(``coati sft`` / ``coati rm``, and ``coati rlhf``'s first two: launcher/stage.py).

Linear, like torchtitan's train loop: take a step, hand its row to the command's hooks in order, and at each step
boundary look whether SIGINT/SIGTERM asked the run to stop (``StopRequest``, launcher/stop.py). Commands differ
only in what a step is, what a checkpoint writes and which hooks they compose::

    with RunLoop(stop, step, checkpoint, hooks=[...]) as loop:   # the hooks are closed however the run ends
        last = loop.run(first)        # steps until step() returns None or ``last``; a stop raises RunInterrupted
        ...                           # the command's final evaluation and save

A hook is a ``Hook`` with some of its methods, called in the order the command lists the hooks:
- ``after_step(step, row)``: a trained step (counted from 1): log it, feed the health monitors, check the weights'
  delivery, evaluate when due, save every -si steps, move the progress bar (``Every`` for the periodic ones);
- ``after_skip(step, row)``: a step call that trained nothing (its row has "skipped": DAPO's filter emptied it);
  ``step`` is the last trained one;
- ``settle()``: before a stop's exit: wait for the work in flight (evaluations), so that it lands in the logs;
- ``close()``: when the loop's ``with`` ends, however: close files and bars.

A stop: the step under way finishes, the loop writes ``checkpoint(step)`` (none when no step call returned since the
start or the resume: the newest checkpoint already is that state), settles the hooks and raises ``RunInterrupted``
(one line; exit status 130/143). Bounded waits live in the step itself: RL's waits go through the run's supervisor
(coati/cluster/supervision.py), a Ray stage's through its trainer group's calls (coati/cluster/trainer_group.py);
both take their bounds from coati/cluster/deadlines.py and call a silent actor stuck in one line.
"""

from __future__ import annotations

from typing import Callable

from coati.launcher.stop import StopRequest


class Hook:
    """What a hook may do at the loop's points; each a no-op here. Subclass it, or give functions by name:
    ``Hook(after_step=lambda step, row: ...)``."""

    def __init__(self, **methods: Callable):
        for name, method in methods.items():
            if not callable(getattr(Hook, name, None)):
                raise TypeError(f"Hook has no point {name!r}")
            setattr(self, name, method)

    def after_step(self, step: int, row: dict) -> None:
        pass

    def after_skip(self, step: int, row: dict) -> None:
        pass

    def settle(self) -> None:
        pass

    def close(self) -> None:
        pass


class RunLoop:
    def __init__(self, stop: StopRequest, step: Callable[[int], dict | None], checkpoint: Callable[[int], str],
                 hooks: list[Hook]):
        """``step(done)``: train the step after ``done`` trained steps; its metrics row, or None when no step is
        left. ``checkpoint(step)``: write the run's state after ``step`` trained steps; its path."""
        self.stop, self.take_step, self.checkpoint, self.hooks = stop, step, checkpoint, hooks
        self.step = 0  # trained steps, a resumed run's earlier ones included
        self.skipped = 0  # step calls that trained nothing
        self.calls = 0  # step calls that returned a row in this process (0: the state is the start's)

    def __enter__(self) -> RunLoop:
        return self

    def __exit__(self, *exc) -> None:
        for hook in self.hooks:
            hook.close()

    def run(self, first: int = 0, skipped: int = 0, last: int | None = None) -> int:
        """Train from ``first`` trained steps (``skipped`` step calls that trained nothing, a resume's) until the
        step says none is left or ``last`` steps are trained; the steps trained. A signal from here on waits for a
        step boundary; one during what the command does after ``run`` lets that finish."""
        self.step, self.skipped = first, skipped
        self.stop.deferred = True
        while not self.stop.requested and (last is None or self.step < last):
            row = self.take_step(self.step)
            if row is None:
                break
            self.calls += 1
            if "skipped" in row:
                self.skipped += 1
                for hook in self.hooks:
                    hook.after_skip(self.step, row)
                continue
            self.step += 1
            for hook in self.hooks:
                hook.after_step(self.step, row)
        if self.stop.requested:  # a step boundary: save it (the command's end is skipped) and stop
            path = self.checkpoint(self.step) if self.calls else None
            for hook in self.hooks:
                hook.settle()
            raise self.stop.interrupted(self.step, path)
        return self.step


class Every(Hook):
    """``action(step)`` after every ``interval``-th trained step (0: never); ``before``: only below that step (the
    command's end does the last one itself)."""

    def __init__(self, interval: int, action: Callable[[int], object], before: int | None = None):
        self.interval, self.action, self.before = interval, action, before

    def after_step(self, step: int, row: dict) -> None:
        if self.interval and step % self.interval == 0 and (self.before is None or step < self.before):
            self.action(step)


class MetricsRows(Hook):
    """Every row into the run's metrics log (``MetricsLogger``: metrics.jsonl, wandb), which it closes."""

    def __init__(self, logger):
        self.logger = logger

    def after_step(self, step: int, row: dict) -> None:
        self.logger.log(step, row)

    def after_skip(self, step: int, row: dict) -> None:
        self.logger.log(step, row, kind="skipped")

    def close(self) -> None:
        self.logger.close()


class HealthChecks(Hook):
    """The run-health monitors (launcher/health.py) fed every row; a warning is one line and a "health" row.
    ``feed`` also takes the evaluation rows."""

    def __init__(self, health, logger, log):
        self.health, self.logger, self.log = health, logger, log

    def feed(self, step: int, row: dict) -> None:
        for warning in self.health.feed(step, row):
            self.log(warning.text)
            self.logger.log(step, warning.row(), kind="health")

    after_step = after_skip = feed


class ProgressBar(Hook):
    """A tqdm bar moved by every trained step; ``postfix(row)``: what it shows beside the count."""

    def __init__(self, bar, postfix: Callable[[dict], dict]):
        self.bar, self.postfix = bar, postfix

    def after_step(self, step: int, row: dict) -> None:
        self.bar.update(1)
        self.bar.set_postfix(**self.postfix(row))

    def close(self) -> None:
        self.bar.close()
