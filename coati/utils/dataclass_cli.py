"""Command-line flags and YAML configs generated from a config dataclass: one source for every option's name,
short aliases, default and help (the field and its metadata).

``option(default, help, "-m")`` declares a field; ``build_parser(cls)`` turns each field into ``--field-name``
(plus its aliases) with the field's type; ``parse(cls, argv)`` reads ``--config FILE.yaml`` first, then the
flags: precedence is field default < YAML < flags. YAML keys are the field names (``learning_rate`` or
``learning-rate``); an unknown key or a value of the wrong type is one ``ConfigFileError`` line.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import types
import typing
from typing import Any


class ConfigFileError(ValueError):
    """A bad --config file or key; the message names the file, the key and what it must be."""


def option(default: Any, help: str, *aliases: str, choices: tuple | None = None, metavar: str | None = None):
    """A config field that is also a flag: ``--name`` (from the field name) and ``aliases`` such as ``-lr``."""
    return dataclasses.field(default=default, metadata={"help": help, "aliases": aliases, "choices": choices,
                                                        "metavar": metavar})


def _base_type(annotation) -> tuple[type, bool]:
    """(the scalar type, whether None is allowed) of ``int``, ``str | None``, ``Optional[float]``..."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        kinds = [arg for arg in args if arg is not type(None)]
        if len(kinds) != 1:
            raise TypeError(f"unsupported option type {annotation}")
        return kinds[0], True
    return annotation, False


def fields(cls) -> list[tuple[dataclasses.Field, type, bool]]:
    hints = typing.get_type_hints(cls)
    return [(f, *_base_type(hints[f.name])) for f in dataclasses.fields(cls) if "help" in f.metadata]


def flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


def build_parser(cls, prog: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description,
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--config", default=None, metavar="FILE.yaml",
                        help="YAML file of options (keys: the long flag names, e.g. learning_rate: 1e-4); "
                             "flags given on the command line win over it")
    for f, kind, _ in fields(cls):
        meta = f.metadata
        names = [*meta["aliases"], flag_name(f.name)]
        common = dict(dest=f.name, default=f.default, help=meta["help"])
        if kind is bool:
            parser.add_argument(*names, action=argparse.BooleanOptionalAction, **common)
        else:
            parser.add_argument(*names, type=kind, choices=meta["choices"], metavar=meta["metavar"], **common)
    return parser


def _coerce(value, kind: type, optional: bool, where: str):
    if value is None and optional:
        return None
    if kind is float and isinstance(value, str):  # YAML 1.1 reads 1e-3 as a string
        try:
            return float(value)
        except ValueError:
            pass
    ok = (isinstance(value, bool) if kind is bool else
          isinstance(value, (int, float)) and not isinstance(value, bool) if kind is float else
          isinstance(value, int) and not isinstance(value, bool) if kind is int else isinstance(value, kind))
    if not ok:
        raise ConfigFileError(f"{where} must be {kind.__name__}{' or null' if optional else ''}, got {value!r}")
    return float(value) if kind is float else value


def read_config_file(cls, path: str) -> dict:
    """The YAML file's values by field name, checked against ``cls``."""
    import yaml

    if not os.path.isfile(path):
        raise ConfigFileError(f"--config file not found: {path}")
    try:
        with open(path, encoding="utf-8") as handle:
            raw = yaml.safe_load(handle)
    except yaml.YAMLError as err:
        raise ConfigFileError(f"--config {path} is not valid YAML ({str(err).splitlines()[0]})") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigFileError(f"--config {path} must be a mapping of option: value, e.g. learning_rate: 1e-4")
    known = {f.name: (f, kind, optional) for f, kind, optional in fields(cls)}
    values = {}
    for key, value in raw.items():
        name = str(key).replace("-", "_")
        if name not in known:
            raise ConfigFileError(f"--config {path} has unknown key {key!r}; valid keys: {', '.join(known)}")
        f, kind, optional = known[name]
        value = _coerce(value, kind, optional, f"--config {path} key {key!r}")
        if f.metadata["choices"] and value not in f.metadata["choices"]:
            raise ConfigFileError(f"--config {path} key {key!r} must be one of {', '.join(map(str, f.metadata['choices']))}, "
                                  f"got {value!r}")
        values[name] = value
    return values


def parse(cls, argv: list[str] | None, prog: str, description: str):
    """``cls`` instance from ``--config`` and the flags (argparse exits on a malformed flag, as usual)."""
    parser = build_parser(cls, prog, description)
    first, _ = parser.parse_known_args(argv)
    if first.config:
        parser.set_defaults(**read_config_file(cls, first.config))
    args = vars(parser.parse_args(argv))
    args.pop("config")
    return cls(**args)
