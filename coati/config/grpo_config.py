"""--grpo-config: its keys, their types and help, all made from the fields of AlgoConfig's ``loss``, ``groups``, ``optim``
(and AlgoConfig's own fields marked ``grpo_key=True``), and the algorithm config built from preset < overrides <
dedicated flags. A new knob is one field: it is then a key here, and a flag too when it is an ``option()``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import typing
from dataclasses import dataclass

from coati.algorithm.registry import POLICY_LOSSES, adv_estimator_names
from coati.config.algo import ALGO_PRESETS, AlgoConfig
from coati.config.errors import ConfigError, require
from coati.config.ppo import PPOConfig
from coati.utils.dataclass_cli import (
    ConfigFileError,
    base_type,
    check_value,
    did_you_mean,
    doc_of,
    field_dest,
    field_keys,
    kind_name,
)

SECTIONS = ("loss", "groups", "optim")  # AlgoConfig's fields whose every field is a key


@dataclass(frozen=True)
class Knob:
    """One --grpo-config key: the field it sets and where that field sits in AlgoConfig."""

    section: str | None  # "loss", "groups", or None for AlgoConfig's own field
    field: dataclasses.Field
    kind: type
    optional: bool

    @property
    def key(self) -> str:
        return self.field.name

    @property
    def is_flag(self) -> bool:
        return "help" in self.field.metadata

    @property
    def dest(self) -> str:
        """The flag's destination (its value in the parsed flags), for an option."""
        return field_dest(self.field)

    @property
    def names(self) -> tuple[str, ...]:
        """The key, its flag's destination and long aliases' names and older names (``beta``)."""
        return tuple(dict.fromkeys((self.key, *field_keys(self.field))))

    @property
    def flag(self) -> str | None:
        return "--" + self.dest.replace("_", "-") if self.is_flag else None

    @property
    def text(self) -> str:
        null = " or null" if self.optional else ""
        doc = f"as {self.flag}" if self.is_flag else doc_of(self.field)
        return f"{self.key} ({kind_name(self.kind)}{null}, {json.dumps(self.field.default)}): {doc}"


def _knobs_of(cls, section: str | None, only_marked: bool):
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.init and (not only_marked or f.metadata.get("grpo_key")):
            yield Knob(section, f, *base_type(hints[f.name]))


def grpo_keys(algo_cls=AlgoConfig) -> dict[str, Knob]:
    """key -> Knob, in field order: the fields of ``algo_cls``'s SECTIONS, then its own marked fields."""
    hints = typing.get_type_hints(algo_cls)
    knobs = [knob for section in SECTIONS for knob in _knobs_of(hints[section], section, False)]
    knobs += _knobs_of(algo_cls, None, True)
    return {knob.key: knob for knob in knobs}


def grpo_config_help(algo_cls=AlgoConfig) -> str:
    knobs = grpo_keys(algo_cls).values()
    flags = ", ".join(knob.flag for knob in knobs if knob.is_flag)
    return ("overrides of the -a preset: a JSON object or the path of a .json/.yaml file, e.g. "
            "'{\"clip_eps_high\": 0.28, \"filter_range\": [0.1, 0.9]}'. Keys (type, field default): "
            + "; ".join(knob.text for knob in knobs)
            + f". Registered names: objective {' | '.join(POLICY_LOSSES)}; advantage "
              f"{' | '.join(adv_estimator_names())}"
            + f". Precedence: preset < --grpo-config < dedicated flags ({flags})")


def check_presets(algo_cls=AlgoConfig) -> None:
    """Every key of every ALGO_PRESETS row names a field (an older name is not enough: a row is code)."""
    keys = grpo_keys(algo_cls)
    for name, row in ALGO_PRESETS.items():
        unknown = sorted(set(row) - set(keys))
        if unknown:
            raise TypeError(f"ALGO_PRESETS[{name!r}] sets {unknown[0]!r}, which is not a --grpo-config key"
                            + did_you_mean(unknown[0], keys))


def algo_preset(name: str, max_new_tokens: int, algo_cls=AlgoConfig) -> dict:
    """The --grpo-config values an algorithm starts from: the fields' defaults, then its row of ``ALGO_PRESETS``."""
    values = {key: knob.field.default for key, knob in grpo_keys(algo_cls).items()}
    values["cache_length"] = max(1, min(1024, max_new_tokens // 4))
    values.update(ALGO_PRESETS[name])
    return values


def build_algo_config(name: str, learning_rate: float, max_grad_norm: float, max_new_tokens: int,
                      overrides: dict | None = None, ppo: PPOConfig | None = None, algo_cls=AlgoConfig,
                      **flags) -> AlgoConfig:
    """Preset of ``name`` <- --grpo-config ``overrides`` <- dedicated flags (by key: ``kl_loss_coef`` = -kl,
    ``ppo_epochs``, ``topk_samples``, ...): later wins; a flag left at None does not override."""
    knobs = grpo_keys(algo_cls)
    unknown = set(flags) - set(knobs)
    if unknown:
        raise TypeError(f"build_algo_config: {sorted(unknown)} are not --grpo-config keys")
    values = algo_preset(name, max_new_tokens, algo_cls)
    values.update(overrides or {})
    values.update({key: value for key, value in flags.items() if value is not None})
    parts: dict[str | None, dict] = {}
    for key, knob in knobs.items():
        parts.setdefault(knob.section, {})[key] = values[key]
    hints = typing.get_type_hints(algo_cls)
    sections = {section: hints[section](**kwargs) for section, kwargs in parts.items() if section is not None}
    return algo_cls(name=name, learning_rate=learning_rate, max_grad_norm=max_grad_norm, ppo=ppo or PPOConfig(),
                    **sections, **parts.get(None, {}))


def parse_grpo_config(text: str | None, algo_cls=AlgoConfig) -> dict:
    """--grpo-config: a JSON object, or the path of a .json/.yaml/.yml file holding one -> checked overrides by
    key (an older name, e.g. ``beta``, is taken as its key)."""
    if not text:
        return {}
    source, yaml_file = "--grpo-config", text.lower().endswith((".yaml", ".yml"))
    if text.lower().endswith((".json", ".yaml", ".yml")):
        require(os.path.isfile(text), f"--grpo-config file not found: {text}")
        source = f"--grpo-config file {text}"
        with open(text, encoding="utf-8") as handle:
            text = handle.read()
    overrides = _load_yaml(text, source) if yaml_file else _load_json(text, source)
    require(isinstance(overrides, dict),
            f"{source} must be a JSON object of key -> value, e.g. '{{\"clip_eps_high\": 0.28}}'")
    knobs = grpo_keys(algo_cls)
    names = {name: knob for knob in knobs.values() for name in knob.names}
    checked = {}
    for key, value in overrides.items():
        require(key in names, f"{source} has unknown key {key!r}; valid keys: {', '.join(knobs)}"
                + did_you_mean(str(key), names))
        knob = names[key]
        try:  # a YAML file's 1e-3 is a string to YAML 1.1: taken as the number it is; JSON's "0.28" is not
            checked[knob.key] = check_value(value, knob.kind, knob.optional, f"{source} key {key!r}",
                                            strings=yaml_file)
        except ConfigFileError as err:
            raise ConfigError(str(err)) from None
    return checked


def _load_yaml(text: str, source: str):
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{source} is not valid YAML ({str(err).splitlines()[0]})") from None


def _load_json(text: str, source: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"{source} is not valid JSON ({err.msg}); pass e.g. '{{\"clip_eps_high\": 0.28}}' "
                          "or the path of a .json/.yaml file") from None


check_presets()  # a preset row with a misspelt key fails here, at import
