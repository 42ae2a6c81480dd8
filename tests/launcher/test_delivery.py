"""The weight-delivery check's pieces, by hand: the gap on rows sampled by the trainer's own weights, the bound
by precision, and the verdict line."""

from __future__ import annotations

import pytest
import torch

from coati.algorithm.policy_losses import LossInputs
from coati.config.cli import build_parser, config_from_args
from coati.config.errors import ConfigError
from coati.config.validate import validate
from coati.launcher.delivery import DeliveryCheck
from coati.trainer.objective import delivery_gap


def inputs(trainer, behaviour, mask) -> LossInputs:
    trainer, behaviour, mask = (torch.tensor(v, dtype=torch.float32) for v in (trainer, behaviour, mask))
    return LossInputs(trainer, behaviour, torch.zeros(len(mask)), mask, 1.0)


def config(*flags: str):
    return config_from_args(build_parser().parse_args(["-m", "m", "-d", "d.jsonl", *flags]))


def test_the_gap_is_the_largest_on_valid_tokens_of_fresh_rows():
    x = inputs([[-1.0, -2.0, -0.5], [-1.0, -1.0, -1.0]],
               [[-1.1, -2.5, -9.0], [-4.0, -1.0, -1.0]],
               [[1, 1, 0], [1, 1, 1]])
    assert float(delivery_gap(x, torch.tensor([True, False]))) == pytest.approx(0.5)  # -9.0 is masked, row 1 stale
    assert float(delivery_gap(x, torch.tensor([True, True]))) == pytest.approx(3.0)
    assert float(delivery_gap(x, torch.tensor([False, False]))) == -1.0  # nothing to check here


def test_the_bound_follows_the_least_precise_model():
    run = config().run
    assert run.delivery_limit("fp32") == 1e-3
    assert run.delivery_limit("bf16") == 5.0 and run.delivery_limit("fp16") == 5.0
    assert config("--delivery-bound", "0.02").run.delivery_limit("bf16") == 0.02
    assert DeliveryCheck.of(config(), ["fp32", "bf16"]).bound == 5.0  # the least precise engine counts
    assert DeliveryCheck.of(config(), ["fp16"]).precision == "fp16"
    with pytest.raises(ConfigError, match="--delivery-bound -1: a gap in nats is >= 0"):
        validate(config("--delivery-bound", "-1"))


def test_the_verdict_names_the_version_the_gap_and_the_bound():
    check = DeliveryCheck.of(config(), ["fp32"])
    assert check.stops and check.bound == 1e-3 and check.precision == "fp32"
    assert check.problem(3, {"delivery_gap": 5e-4, "delivery_version": 1}) is None
    assert check.problem(4, {"loss": 0.1}) is None  # no row of the step was sampled by the trainer's weights
    line = check.problem(3, {"delivery_gap": 0.25, "delivery_version": 1})
    assert line.startswith("step 3: weights v1 did not reach the engines as trained: the rows they sampled score up "
                           "to 0.25 nats apart from the trainer's (bound 0.001 in fp32)"), line
    bf16 = DeliveryCheck.of(config("--precision", "bf16"), ["fp32"])
    assert bf16.precision == "bf16" and bf16.problem(3, {"delivery_gap": 0.25, "delivery_version": 1}) is None
    off = DeliveryCheck.of(config("--delivery-check", "off"), ["fp32"])
    assert off.problem(3, {"delivery_gap": 9.0, "delivery_version": 1}) is None
    assert not DeliveryCheck.of(config("--delivery-check", "warn"), ["fp32"]).stops
