"""A trainer-group actor class that only reports its process's environment (imported by name, so that Ray workers
started with a runtime environment of their own find it)."""

from __future__ import annotations

import os


class EnvironProbe:
    def __init__(self, rank: int, num_threads: int):
        self.rank = rank

    def environ(self, names: list[str]) -> dict:
        return {name: os.environ.get(name) for name in names}
