"""Command-line flags and YAML configs generated from a tree of config dataclasses: one source for every option's
name, short aliases, default and help (the field and its metadata).

``option(default, help, "-m")`` declares a field; ``build_parser(cls)`` turns each such field of ``cls``, and of
every dataclass nested in it (a field whose type is a dataclass), into ``--field-name`` (plus its aliases) with
the field's type. Flag names are flat, so they must be unique across the tree: a clash raises ``OptionClash``
when the tree's options are first listed. ``--config FILE.yaml`` is read before the flags: precedence is field
default < YAML < flags. YAML keys are the long flag names (``learning_rate`` or ``learning-rate``); an unknown
key or a value of the wrong type is one ``ConfigFileError`` line. ``construct(cls, values)`` builds the tree
back from the parsed values.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import types
import typing
from typing import Any


class ConfigFileError(ValueError):
    """A bad --config file or key; the message names the file, the key and what it must be."""


class OptionClash(TypeError):
    """Two fields of one config tree would make the same flag or YAML key."""


def option(default: Any, help: str, *aliases: str, choices: tuple | None = None, metavar: str | None = None,
           flag: str | None = None, kind: type | None = None, resolved: bool = False, repeat: bool = False):
    """A config field that is also a flag: ``--name`` (from the field name) and ``aliases`` such as ``-lr``.

    ``flag``: the long flag when it is not the field's name (ColossalChat's ``--master_address``, ``--model``
    for ``ModelConfig.path``). ``kind``: the flag's value type when the field holds something parsed from it.
    ``resolved``: the flag defaults to None, meaning "not given", and the program resolves the value (a default
    that depends on the situation, or a precedence between sources); the field's own default serves configs built
    in code. ``default`` may be ``dataclasses.MISSING`` for a field the program always fills in. ``repeat``: the
    flag may be given several times (a YAML list); the field holds a tuple of ``kind`` values.
    """
    return dataclasses.field(default=default, metadata={"help": help, "aliases": aliases, "choices": choices,
                                                        "metavar": metavar, "flag": flag, "kind": kind,
                                                        "resolved": resolved, "repeat": repeat})


@dataclasses.dataclass(frozen=True)
class Option:
    """One flag of a config tree: the field that owns it and where that field sits."""

    field: dataclasses.Field
    path: tuple[str, ...]  # field names from the root to the dataclass owning ``field``
    owner: type
    kind: type
    optional: bool

    @property
    def long(self) -> str:
        return _long(self.field)

    @property
    def dest(self) -> str:
        """The argparse destination and the YAML key."""
        return _dest(self.field)

    @property
    def flags(self) -> tuple[str, ...]:
        return (*self.field.metadata["aliases"], self.long)

    @property
    def where(self) -> str:
        return f"{self.owner.__name__}.{self.field.name}"

    @property
    def parser_default(self):
        # argparse appends a repeated flag's values to its default: None, and the field's default when not given
        return None if self.field.metadata["resolved"] or self.field.metadata.get("repeat") else self.field.default


def _base_type(annotation) -> tuple[type, bool]:
    """(the scalar type, whether None is allowed) of ``int``, ``str | None``, ``Optional[float]``..."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        kinds = [arg for arg in args if arg is not type(None)]
        if len(kinds) != 1:
            raise TypeError(f"unsupported option type {annotation}")
        return kinds[0], True
    return annotation, False


def is_option(f: dataclasses.Field) -> bool:
    return "help" in f.metadata


def flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


def _long(f: dataclasses.Field) -> str:
    return f.metadata["flag"] or flag_name(f.name)


def _dest(f: dataclasses.Field) -> str:
    return _long(f).lstrip("-").replace("-", "_")


def _walk(cls, path: tuple[str, ...]):
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if is_option(f):
            kind, optional = _base_type(hint)
            if f.metadata["kind"] is not None:
                kind = f.metadata["kind"]
            yield Option(f, path, cls, kind, optional or f.metadata["resolved"])
        elif dataclasses.is_dataclass(hint):
            yield from _walk(hint, (*path, f.name))


@functools.cache
def options(cls) -> tuple[Option, ...]:
    """Every option field of ``cls`` and of the dataclasses nested in it, depth first in field order."""
    found = tuple(_walk(cls, ()))
    taken = {"--config": "--config", "config": "--config", "-h": "--help", "--help": "--help", "help": "--help"}
    for opt in found:
        names = [*opt.flags, opt.dest]
        if opt.kind is bool:
            names += ["--no-" + name[2:] for name in opt.flags if name.startswith("--")]
        for name in dict.fromkeys(names):
            if name in taken:
                raise OptionClash(f"{cls.__name__}: {opt.where} would make {name!r}, which {taken[name]} already "
                                  "makes; give one of them another name (option(..., flag=...))")
            taken[name] = opt.where
    return found


def build_parser(cls, prog: str, description: str) -> argparse.ArgumentParser:
    parser = _ConfigFileParser(cls, prog=prog, description=description,
                               formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--config", default=None, metavar="FILE.yaml",
                        help="YAML file of options (keys: the long flag names, e.g. learning_rate: 1e-4); "
                             "flags given on the command line win over it")
    groups = {(): parser}
    for opt in options(cls):
        if opt.path not in groups:  # a nested dataclass's flags are listed under its place in the tree
            groups[opt.path] = parser.add_argument_group(".".join(opt.path))
        meta = opt.field.metadata
        common = dict(dest=opt.dest, default=opt.parser_default, help=meta["help"])
        if opt.kind is bool:
            groups[opt.path].add_argument(*opt.flags, action=argparse.BooleanOptionalAction, **common)
        elif meta.get("repeat"):
            groups[opt.path].add_argument(*opt.flags, action="append", type=opt.kind, metavar=meta["metavar"],
                                          **common)
        else:
            groups[opt.path].add_argument(*opt.flags, type=opt.kind, choices=meta["choices"], metavar=meta["metavar"],
                                          **common)
    return parser


class _ConfigFileParser(argparse.ArgumentParser):
    """Reads ``--config FILE.yaml`` into the defaults before parsing the flags, for every ``parse_args`` caller."""

    def __init__(self, cls, **kwargs):
        super().__init__(**kwargs)
        self.config_cls = cls

    def parse_known_args(self, args=None, namespace=None):
        reader = argparse.ArgumentParser(add_help=False)
        reader.add_argument("--config", default=None)
        path = reader.parse_known_args(args)[0].config
        if not path:
            return super().parse_known_args(args, namespace)
        values = read_config_file(self.config_cls, path)
        saved = dict(self._defaults), {action: action.default for action in self._actions}
        self.set_defaults(**values)
        try:
            return super().parse_known_args(args, namespace)
        finally:  # the file's values are this call's defaults only
            self._defaults = saved[0]
            for action, default in saved[1].items():
                action.default = default


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
    """The YAML file's values by option ``dest``, checked against the options of ``cls``."""
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
    known = {opt.dest: opt for opt in options(cls)}
    values = {}
    for key, value in raw.items():
        name = str(key).replace("-", "_")
        if name not in known:
            raise ConfigFileError(f"--config {path} has unknown key {key!r}; valid keys: {', '.join(known)}")
        opt = known[name]
        if opt.field.metadata.get("repeat"):  # a list, or one value
            value = [_coerce(item, opt.kind, False, f"--config {path} key {key!r} item")
                     for item in (value if isinstance(value, list) else [value])]
            values[name] = value
            continue
        value = _coerce(value, opt.kind, opt.optional, f"--config {path} key {key!r}")
        choices = opt.field.metadata["choices"]
        if choices and value is not None and value not in choices:
            raise ConfigFileError(f"--config {path} key {key!r} must be one of {', '.join(map(str, choices))}, "
                                  f"got {value!r}")
        values[name] = value
    return values


def construct(cls, values: dict, **given):
    """``cls`` with its option fields from ``values`` (by dest), nested config dataclasses built the same way,
    ``given`` fields as passed, and every other field at its default."""
    hints = typing.get_type_hints(cls)
    kwargs = dict(given)
    for f in dataclasses.fields(cls):
        if f.name in given or not f.init:
            continue
        if is_option(f) and f.metadata.get("repeat"):
            kwargs[f.name] = tuple(values[_dest(f)] or ())
        elif is_option(f):
            kwargs[f.name] = values[_dest(f)]
        elif dataclasses.is_dataclass(hints[f.name]) and options(hints[f.name]):
            kwargs[f.name] = construct(hints[f.name], values)
    return cls(**kwargs)


def parse(cls, argv: list[str] | None, prog: str, description: str):
    """``cls`` instance from ``--config`` and the flags (argparse exits on a malformed flag, as usual)."""
    return construct(cls, vars(build_parser(cls, prog, description).parse_args(argv)))
