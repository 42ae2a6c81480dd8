"""Batch sizes not given follow the given ones (coati/config/batch_defaults.py): a single flag never clashes with
a default; two given flags that clash are still refused in one line."""

import re

import pytest

from coati.config.batch_defaults import follow_given, free_knobs, nearest
from coati.config.cli import MODEL_DEFAULTS, build_parser, config_from_args
from coati.config.errors import ConfigError

LAYOUT = {"num_trainers": 1, "num_inferencer": 1, "tensor_parallel_size": 1, "pipeline_parallel_size": 1,
          "colocate": None, "learner_chunk_size": 0, "num_generations": 8}
NONE = dict.fromkeys(("inference_batch_size", "inference_microbatch_size", "train_batch_size",
                      "train_minibatch_size", "train_microbatch_size"))


def follow(**given):
    layout = {key: given.pop(key) for key in list(given) if key in LAYOUT}
    return follow_given({**LAYOUT, **NONE, **layout, **given}, MODEL_DEFAULTS)


def sizes(out):
    return tuple(out[key] for key in ("inference_batch_size", "inference_microbatch_size", "train_batch_size",
                                      "train_minibatch_size", "train_microbatch_size"))


@pytest.mark.parametrize("given, expected", [
    ({}, (64, 64, 32, 32, 256)),  # the defaults themselves
    ({"inference_batch_size": 8}, (8, 8, 8, 8, 64)),  # -imbs <= 8; a step of 8 prompts tiles the round; 8 x G = 64
    ({"train_batch_size": 8}, (64, 64, 8, 8, 64)),
    ({"train_batch_size": 48}, (48, 48, 48, 24, 192)),  # the round a multiple of 48; 24 is 32's nearest divisor
    ({"train_minibatch_size": 64}, (64, 64, 64, 64, 256)),  # -tbs a multiple of 64
    ({"inference_microbatch_size": 128}, (128, 128, 32, 32, 256)),  # -ibs >= -imbs
    ({"train_batch_size": 128}, (128, 64, 128, 32, 256)),  # a round must hold one step
    ({"inference_batch_size": 6, "num_trainers": 2}, (6, 6, 3, 3, 24)),  # dp 2 x tbs 3 = the round's 6
    ({"inference_batch_size": 3, "num_generations": 2}, (3, 3, 3, 3, 6)),
    ({"pipeline_parallel_size": 2, "num_trainers": 2, "train_batch_size": 1, "inference_batch_size": 8,
      "num_generations": 1}, (8, 8, 1, 1, 1)),  # -tmbs >= -pp cannot hold with 1 sample per step: validate says so
])
def test_sizes_not_given_follow_the_given_ones(given, expected):
    out = follow(**given)
    assert sizes(out) == expected
    for key, value in given.items():
        assert out.get(key, value) == value  # a given size stays exact


def test_nearest_prefers_the_largest_below_the_default():
    assert nearest(32, lambda n: 48 % n == 0) == 24
    assert nearest(32, lambda n: n % 64 == 0) == 64
    assert nearest(32, lambda n: False) == 32  # nothing fits: the default, for validate to refuse


def config(*argv, model, data):
    parser = build_parser()
    return config_from_args(parser.parse_args(["-m", model, "-d", data, *argv]), given=parser.given)


@pytest.fixture
def inputs(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    data = tmp_path / "d.jsonl"
    data.write_text('{"question": "1+1", "answer": "2"}\n')
    return {"model": str(model), "data": str(data)}


def test_ibs_alone_is_a_valid_config(inputs):
    b = config("-ibs", "8", **inputs).batch
    assert (b.inference_batch_size, b.inference_microbatch_size, b.train_batch_size) == (8, 8, 8)


@pytest.mark.parametrize("argv, message", [
    (["-ibs", "8", "-imbs", "16"], "-ibs (8) must be >= -imbs (16)"),
    (["-ibs", "8", "-tbs", "16"], "num_inferencer*ibs (8) must be a multiple of data-parallel trainers*tbs (16)"),
    (["-tbs", "16", "-tMbs", "32"], "-tbs (16) must be >= -tMbs (32)"),
    (["-tMbs", "2", "-g", "2", "-tmbs", "8"], "-tMbs*g (4 samples) must be >= -tmbs (8)"),
])
def test_two_given_sizes_that_clash_are_one_line(inputs, argv, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        config(*argv, **inputs)


def test_memory_knobs_not_given_are_left_to_the_plan(inputs):
    assert free_knobs(config(**inputs)) == ("train_microbatch_size", "inference_microbatch_size", "vllm_kv_cache_gb")
    assert free_knobs(config("-tmbs", "4", "--vllm-kv-cache-gb", "2", **inputs)) == ("inference_microbatch_size",)
    assert config(**inputs).parallel.vllm_kv_cache_gb == 1.0
