"""docs/training.md's LoRA section names the plugins that train adapters (and those that refuse) exactly as the
registry's ``trains_adapters`` rows say, as the refusal line does."""

from __future__ import annotations

import os
import re

from coati.registry.plugins import PLUGINS, adapter_plugins

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_lora_section_names_the_plugins_the_registry_trains_adapters_on():
    with open(os.path.join(ROOT, "docs", "training.md")) as handle:
        text = handle.read()
    section = text.split("## LoRA adapters", 1)[1].split("\n## ", 1)[0]
    bullet = re.search(r"^- Trainer plugins: (.+?)(?=^- |\Z)", section, re.MULTILINE | re.DOTALL)
    assert bullet, "the LoRA section has no '- Trainer plugins:' bullet"
    training, rest = bullet.group(1).split(" the others ", 1)
    refusing = rest.split(")", 1)[0]  # "(`torch-tp`, ...)"
    named = [name for name in re.findall(r"`([^`]+)`", training) if name in PLUGINS]
    assert named == [name for name, spec in PLUGINS.items() if spec.trains_adapters]
    assert ", ".join(named) == adapter_plugins()  # what the refusal line lists
    refused = [name for name in re.findall(r"`([^`]+)`", refusing) if name in PLUGINS]
    assert refused == [name for name, spec in PLUGINS.items() if not spec.trains_adapters]
