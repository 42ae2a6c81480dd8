"""Fixtures of the trainer-group tests: a local Ray cluster per test module."""

from __future__ import annotations

import pytest
import ray


@pytest.fixture(scope="module")
def local_ray():
    """Four CPU slots: a two-rank trainer group plus the buffer and weight store (num_cpus=0) fit."""
    ray.init(num_cpus=4, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    yield
    ray.shutdown()
