"""Quiet actors: library chatter that tells a user nothing, switched off inside the Ray actors only.

Every actor loads a model (transformers' "Loading weights" bar) and the trainer saves one ("Writing model
shards"); Ray forwards each bar to the driver's terminal under the actor's name, once per actor, between
the run's own progress bar and eval lines. ``quiet_actor()`` is the first call of every actor's
``__init__``: it turns off transformers' and huggingface_hub's progress bars and vLLM's INFO logs in that
worker process. Warnings and errors still come through. The driver and a user's own code that imports
coati keep their bars; Ray's driver-side notices are handled in launch.init_ray.
"""

from __future__ import annotations

import os


def quiet_actor() -> None:
    # vLLM reads its log level when first imported (the inferencers import it after this call).
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    from huggingface_hub.utils import disable_progress_bars
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    disable_progress_bars()
