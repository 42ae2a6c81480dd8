"""docs/architecture.md's "Registered today" lists name exactly what the registries hold, and the map's
file and function names exist."""

from __future__ import annotations

import os
import re

import pytest

from coati.algorithm.registry import ADV_ESTIMATORS, KL_ESTIMATORS, LOSS_AGGREGATIONS, POLICY_LOSSES
from coati.config.algo import ALGO_PRESETS
from coati.layouts.registry import LAYOUTS
from coati.registry.backends import BACKENDS
from coati.registry.plugins import PLUGIN_FAMILIES, PLUGINS
from coati.registry.weight_sync import WEIGHT_SYNCS
from rewards import REWARD_TYPES

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def architecture() -> str:
    with open(os.path.join(ROOT, "docs", "architecture.md")) as handle:
        return handle.read()


def listed(kind: str) -> list[str]:
    match = re.search(rf"^- {re.escape(kind)}: (.+)$", architecture(), re.MULTILINE)
    assert match, f"docs/architecture.md has no '- {kind}:' line"
    return re.findall(r"`([^`]+)`", match.group(1))


@pytest.mark.parametrize("kind, registry", [
    ("inference backends", BACKENDS), ("trainer plugins", PLUGINS), ("plugin families", PLUGIN_FAMILIES),
    ("weight-sync transports", WEIGHT_SYNCS), ("reward types", REWARD_TYPES), ("algorithm presets", ALGO_PRESETS),
    ("policy losses", POLICY_LOSSES), ("advantage estimators", ADV_ESTIMATORS),
    ("loss aggregations", LOSS_AGGREGATIONS), ("KL estimators", KL_ESTIMATORS), ("micro-batch layouts", LAYOUTS),
])
def test_the_map_lists_what_is_registered(kind, registry):
    assert listed(kind) == list(registry)


def test_the_paths_the_map_names_exist():
    paths = set(re.findall(r"`((?:coati|rewards|benchmarks|tests)/[\w/]+\.py)`", architecture()))
    assert paths, "no paths found"
    missing = sorted(path for path in paths if not os.path.exists(os.path.join(ROOT, path)))
    assert not missing, f"docs/architecture.md names files that do not exist: {missing}"
