"""The one error of a bad setting, and the one way to raise it."""

from __future__ import annotations


class ConfigError(ValueError):
    """An impossible or missing setting; the message says which flag to change and how."""


def require(condition: bool, message: str) -> None:
    """``ConfigError(message)`` unless ``condition``: one line naming the problem and the fix."""
    if not condition:
        raise ConfigError(message)
