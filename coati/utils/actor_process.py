"""The first call of every actor's ``__init__``: what a Ray worker process running coati code needs first.

Quiet: every actor loads a model (transformers' "Loading weights" bar) and the trainer saves one ("Writing
model shards"); Ray forwards each bar to the driver's terminal under the actor's name, once per actor,
between the run's own progress bar and eval lines. ``start_actor_process()`` turns off transformers' and
huggingface_hub's progress bars and vLLM's INFO logs in that worker process. Warnings and errors still come
through. The driver and a user's own code that imports coati keep their bars; Ray's driver-side notices are
handled in cluster/connect.init_ray_for.

A user's own parts: the run's ``--plugins`` and the rows its driver registered itself (coati/utils/user_parts.py)
are loaded here, so that every actor knows their names before it builds a model, a loss or an environment.

Crash reports: Ray enables faulthandler for the crashing thread only. A native crash in a trainer or an
inference engine usually happens on a library's own thread (gloo, NCCL, OpenMP, vLLM's engine), which has no
Python frames; what the actor was doing is on its main thread. Dumping every thread names the call (e.g. a
weight gather) in the worker's log (``/tmp/ray/session_*/logs/worker-*-PID.err`` on its node).

SIGTERM at the end: Ray ends a worker it is done with by SIGTERM, whose handler raises SystemExit wherever the
main thread is. When that is inside a ``__del__`` (an actor handle's, say), Python cannot let the exception out:
it ignores it and prints "Exception ignored in ..." with a traceback, which Ray forwards to the driver's
terminal after the run's results. Such a SystemExit is dropped without the print; every other exception in a
``__del__`` is still reported.
"""

from __future__ import annotations

import faulthandler
import io
import os
import sys


def start_actor_process(parts=None) -> None:
    """``parts``: the run's ``UserParts`` (coati/utils/user_parts.py), loaded last, before the actor builds
    anything: its --plugins imported and the driver's own rows put back into their registries."""
    # vLLM reads its log level when first imported (the inferencers import it after this call).
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    from huggingface_hub.utils import disable_progress_bars
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    disable_progress_bars()
    try:
        faulthandler.enable(all_threads=True)
    except (io.UnsupportedOperation, ValueError):  # a stderr without a file descriptor (e.g. captured)
        pass
    if sys.unraisablehook is not _drop_exit_in_finalizer:
        global _report_unraisable
        _report_unraisable = sys.unraisablehook
        sys.unraisablehook = _drop_exit_in_finalizer
    if parts is not None:
        parts.load()


_report_unraisable = sys.unraisablehook


def _drop_exit_in_finalizer(unraisable) -> None:
    if not isinstance(unraisable.exc_value, SystemExit):
        _report_unraisable(unraisable)
