"""Name -> function tables that the algorithm's pieces are chosen from (a name is registered once)."""

from __future__ import annotations

from typing import Callable


def registrar(registry: dict, kind: str) -> Callable[[str], Callable]:
    """``register(name)``: a decorator that files the function under ``name`` in ``registry``."""

    def register(name: str):
        def decorate(fn):
            if name in registry:
                raise ValueError(f"{kind} {name!r} is already registered")
            registry[name] = fn
            return fn

        return decorate

    return register
