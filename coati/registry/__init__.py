"""The kinds of swappable parts, each row one part: inference backends (``backends.py``), trainer plugins
(``plugins.py``) and weight-sync transports (``weight_sync.py``); the built-in reward types are registered in
``rewards/builtin.py``.

A row says what the rest of the code needs to know about a part: its name (the config's choices), its
capabilities (asked instead of comparing names), and where its code lives, as ``"module:attribute"`` text that
``resolve`` imports when the part is built. So this room imports nothing of the project, stays free of torch,
and ``coati/config`` (which must not import torch) reads its choices here.
"""

from __future__ import annotations

import importlib


def resolve(reference: str):
    """The object named by ``"package.module:attribute"``, imported now."""
    module, _, attribute = reference.partition(":")
    return getattr(importlib.import_module(module), attribute)


def lookup(table: dict, name: str, kind: str):
    """``table[name]``, or a ValueError naming the choices."""
    if name not in table:
        raise ValueError(f"unknown {kind} {name!r}; choose one of {', '.join(table)}")
    return table[name]
