"""Trainer plugins: one protocol (``TrainerPlugin``), one implementation per parallel layout."""

from coati.plugins.base import LossFn, MicroBatch, TrainerPlugin
from coati.plugins.torch_single import SingleProcessPlugin


def make_plugin(name: str) -> TrainerPlugin:
    if name == "single":
        return SingleProcessPlugin()
    raise ValueError(f"unknown trainer plugin {name!r}")


__all__ = ["LossFn", "MicroBatch", "SingleProcessPlugin", "TrainerPlugin", "make_plugin"]
