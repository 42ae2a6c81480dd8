"""Batch sizes the user did not give: they follow the ones given, and the memory plan may lower the memory knobs.

Two steps, one owner each. ``follow_given`` (here, pure) fills every batch size left unset so that the batch
relations validate.py checks hold with the sizes that were given (``-ibs 8`` alone: ``-imbs`` 8, ``-tbs`` 8);
a contradiction between two given sizes is left for validate.py to refuse. The memory plan
(coati/launcher/plan.py ``fit_memory``) then picks, among ``MEMORY_KNOBS`` not given, what fits the devices, and
``with_values`` applies its choice to the config.
"""

from __future__ import annotations

import dataclasses

from coati.config.tree import RLConfig
from coati.config.validate import validate
from coati.utils import dataclass_cli

# The knobs the memory plan may choose when the user did not give them (by dest): the trainer's micro-batch and
# the engine's generation memory (the transformers engine's prompts per generate call, vLLM's KV-cache budget).
MEMORY_KNOBS = ("train_microbatch_size", "inference_microbatch_size", "vllm_kv_cache_gb")
BATCHES = ("inference_batch_size", "inference_microbatch_size", "train_batch_size", "train_minibatch_size",
           "train_microbatch_size")


def follow_given(values: dict, defaults: dict) -> dict:
    """The five batch sizes (by dest): each given one (not None in ``values``) as given, each other one its
    situation's default (``defaults``) moved the least that keeps the relations with the given ones: a round
    (generators x -ibs, plus --learner-chunk-size) tiles into steps of dp x -tbs, -tMbs divides -tbs, -imbs <=
    -ibs, -tmbs <= -tMbs x g and >= -pp. Resolved in the order tbs, tMbs, ibs, imbs, tmbs."""
    given = {key: values[key] for key in BATCHES if values.get(key) is not None}
    out = dict(given)
    colocate = values.get("colocate")
    sources = values["num_trainers"] if colocate else values["num_inferencer"]
    dp = max(1, values["num_trainers"] // (values["tensor_parallel_size"] * values["pipeline_parallel_size"]))
    chunk = max(0, values.get("learner_chunk_size") or 0)  # a negative one is refused by its own check
    ibs = given.get("inference_batch_size")

    def tiles(round_prompts: int, tbs: int) -> bool:
        return (sources * round_prompts + chunk) % (dp * tbs) == 0

    if "train_batch_size" not in out:
        step = given.get("train_minibatch_size", 1)
        out["train_batch_size"] = nearest(defaults["train_batch_size"], lambda tbs: tbs % step == 0 and tbs >= step
                                          and (ibs is None or tiles(ibs, tbs)))
    tbs = out["train_batch_size"]
    if "train_minibatch_size" not in out:
        out["train_minibatch_size"] = nearest(defaults["train_minibatch_size"], lambda m: tbs % m == 0, upper=tbs)
    if "inference_batch_size" not in out:
        least = given.get("inference_microbatch_size", 1)
        out["inference_batch_size"] = nearest(defaults["inference_batch_size"],
                                              lambda n: n >= least and tiles(n, tbs))
    if "inference_microbatch_size" not in out:
        out["inference_microbatch_size"] = min(defaults["inference_microbatch_size"], out["inference_batch_size"])
    if "train_microbatch_size" not in out:
        samples = out["train_minibatch_size"] * values["num_generations"]
        out["train_microbatch_size"] = max(min(defaults["train_microbatch_size"], samples),
                                           min(values["pipeline_parallel_size"], samples))
    return out


def micro_batch_tokens(config: RLConfig) -> int:
    """The trainer's padded tokens per forward/backward pass: -tmbt, else -tmbs (per pipeline stage) rows of the
    longest sequence -mpt + -mnt, the micro-batch the memory plan sized, now filled by the rows' real lengths."""
    given = config.batch.train_microbatch_tokens
    if given:
        return given
    rows = max(1, config.batch.train_microbatch_size // config.parallel.pipeline_parallel_size)
    return rows * (config.data.max_prompt_tokens + config.sampling.max_new_tokens)


# Tokens of a packed row under dense attention (sdpa/eager), whose cost grows with the row's square. Measured on a
# 2-core CPU with SmolLM2-135M (1,536 tokens a pass, forward and backward): rows of 64 to 768 tokens cost alike
# within noise, one row of 1,536 1.5x.
DENSE_ROW_TOKENS = 512
VARLEN_ATTENTION = ("flash_attention_2", "flash_attention_3")  # attend within each packed sample only


def packed_row_tokens(attention_implementation: str | None, budget: int) -> int:
    """The most tokens one packed micro-batch (one row) holds: the whole ``budget`` (``micro_batch_tokens``) under
    a variable-length attention kernel, else at most ``DENSE_ROW_TOKENS``."""
    if attention_implementation in VARLEN_ATTENTION:
        return budget
    return min(budget, DENSE_ROW_TOKENS)


def nearest(default: int, fits, upper: int | None = None) -> int:
    """The largest n <= ``default`` (and <= ``upper``) with ``fits(n)``, else the smallest n above it; the default
    itself when no n up to 64 x its size fits (validate.py then names the flags that clash)."""
    top = default if upper is None else min(default, upper)
    below = next((n for n in range(top, 0, -1) if fits(n)), None)
    if below is not None:
        return below
    return next((n for n in range(top + 1, 64 * max(default, 1) + 1) if fits(n)), default)


def free_knobs(config: RLConfig) -> tuple[str, ...]:
    """The ``MEMORY_KNOBS`` the user left to the plan: options recorded as not given (None). A config built in
    code without recorded options has none: its values are exact."""
    return tuple(key for key in MEMORY_KNOBS if key in config.options and config.options[key] is None)


def with_values(config: RLConfig, values: dict) -> RLConfig:
    """``config`` with option fields replaced by dest (``{"train_microbatch_size": 8}``), checked again."""
    if not values:
        return config
    for dest, value in values.items():
        config = _replace_at(config, _path(dest), value)
    validate(config)
    return config


def value_of(config: RLConfig, dest: str):
    obj = config
    for name in _path(dest):
        obj = getattr(obj, name)
    return obj


def flag_of(dest: str) -> str:
    """The flag the user types for ``dest`` (its short one if it has one: ``-tmbs``)."""
    return _option(dest).flags[0]


def _option(dest: str) -> dataclass_cli.Option:
    return next(opt for opt in dataclass_cli.options(RLConfig) if opt.dest == dest)


def _path(dest: str) -> tuple[str, ...]:
    opt = _option(dest)
    return (*opt.path, opt.field.name)


def _replace_at(obj, path: tuple[str, ...], value):
    if len(path) == 1:
        return dataclasses.replace(obj, **{path[0]: value})
    return dataclasses.replace(obj, **{path[0]: _replace_at(getattr(obj, path[0]), path[1:], value)})
