"""Training from Python: ``build_config`` turns keyword arguments or a dict (the keys of ``--config`` YAML) into a
checked RLConfig, ``run`` trains it over Ray and returns a ``RunSummary``.

The same path as ``coati train``: hub names resolved once, the same defaults (no ``model``: the embedded demo),
the same checks before any actor starts (``ConfigError``, one line), the same run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class RunSummary:
    steps: int
    final_metrics: dict  # the last trained step's row of metrics.jsonl (loss, reward, accuracy...)
    eval_before: dict  # "task/sampling" -> held-out accuracy before training (None: no reward defines correctness)
    eval_after: dict
    checkpoint: str  # the final step_N checkpoint: an HF model directory, and --resume PATH continues from it
    metrics_path: str
    wall_s: float


def build_config(mapping: dict | None = None, /, defaults: dict | None = None, **options):
    """The checked RLConfig of ``mapping`` and ``options`` (keywords win), keys as in ``--config`` YAML
    (``model``, ``dataset``, ``learning_rate``...); ``defaults``: a command's own defaults below them (``coati
    ppo``: ``{"algo": "PPO"}``). Hub model names become local snapshot directories here, and a model without a
    ``backend`` gets the engine ``coati train`` would choose for it."""
    return _built(mapping, defaults, options)[0]


def _built(mapping: dict | None, defaults: dict | None, options: dict):
    """(build_config's config, the line that names the engine chosen for a user's model, or None)."""
    from coati.config.cli import config_from_dict
    from coati.launcher.preflight import check_paths, choose_engine, resolve_model_names
    from coati.train import ensure_demo, placeholder_demo

    values = resolve_model_names({**(mapping or {}), **options})
    if values.get("model") is not None:
        return choose_engine(config_from_dict(values, defaults, source="coati.build_config"))
    placeholder = config_from_dict(values, defaults, demo=placeholder_demo(), source="coati.build_config")
    check_paths(placeholder)  # a missing file is one line before the demo's assets are built
    demo = ensure_demo(placeholder.data.reward_type, placeholder.episodes.env)
    return config_from_dict(values, defaults, demo=demo, source="coati.build_config"), None


def run(config=None, /, log=print, **options) -> RunSummary:
    """Train ``config`` (an RLConfig, or a mapping for ``build_config``, with ``options`` on top) after the
    start-up checks. A Ray cluster this call starts is shut down at the end; one already running is left up."""
    import ray

    from coati.config.tree import RLConfig
    from coati.launcher.preflight import check_inputs
    from coati.launcher.rl import run as run_rl

    engine = None
    if not isinstance(config, RLConfig):
        config, engine = _built(config, None, options)
    elif options:
        raise TypeError("run(config, ...): pass options either in an RLConfig or as keywords, not both")
    lines = check_inputs(config)
    started = not ray.is_initialized()
    try:
        result = run_rl(config, log=log, start_lines=(engine, *lines) if engine else lines)
    finally:
        if started:
            ray.shutdown()
    with open(result.metrics_path) as handle:
        trained = [row for row in map(json.loads, handle) if row.get("kind") == "train"]
    final = {key: value for key, value in (trained[-1] if trained else {}).items() if key not in ("kind", "step")}
    return RunSummary(result.steps, final, result.eval_before, result.eval_after, result.final_model_dir,
                      result.metrics_path, result.wall_s)
