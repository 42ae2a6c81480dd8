"""Command-line flags and YAML configs generated from a tree of config dataclasses: one source for every option's
name, short aliases, default and help (the field and its metadata).

``option(default, help, "-m")`` declares a field; ``build_parser(cls)`` turns each such field of ``cls``, and of
every dataclass nested in it (a field whose type is a dataclass), into ``--field-name`` (plus its aliases) with
the field's type. Flag names are flat, so they must be unique across the tree: a clash raises ``OptionClash``
when the tree's options are first listed. ``--config FILE.yaml`` is read before the flags: precedence is field
default < YAML < flags. YAML keys are the long flag names (``learning_rate`` or ``learning-rate``, and a long
alias's name); an unknown key (with a "did you mean" for a near miss) or a value of the wrong type is one
``ConfigFileError`` line. ``check_values`` does the same for any mapping (a YAML file, a section of a pipeline
file, a dict built in code), and ``construct(cls, values)`` builds the tree back from the values.
``setting(default, doc)`` declares a documented field that is not a flag (a key of a JSON/YAML option).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import re
import types
import typing
from typing import Any

from coati.utils.flag_parser import UNDERSCORES_NOTE, FlagParser, RecordedBool, closest


class ConfigFileError(ValueError):
    """A bad --config file or key; the message names the file, the key and what it must be."""


class OptionClash(TypeError):
    """Two fields of one config tree would make the same flag or YAML key."""


def option(default: Any, help: str, *aliases: str, choices: tuple | None = None, metavar: str | None = None,
           flag: str | None = None, kind: type | None = None, resolved: bool = False, repeat: bool = False,
           keys: tuple[str, ...] = (), json_text: bool = False, **extra):
    """A config field that is also a flag: ``--name`` (from the field name) and ``aliases`` such as ``-lr``.

    ``flag``: the long flag when it is not the field's name (ColossalChat's ``--master_address``, ``--model``
    for ``ModelConfig.path``). ``kind``: the flag's value type when the field holds something parsed from it.
    ``resolved``: the flag defaults to None, meaning "not given", and the program resolves the value (a default
    that depends on the situation, or a precedence between sources); the field's own default serves configs built
    in code. ``default`` may be ``dataclasses.MISSING`` for a field the program always fills in. ``repeat``: the
    flag may be given several times (a YAML list); the field holds a tuple of ``kind`` values. ``keys``: further
    names the field takes as a YAML/mapping key (an older name). ``json_text``: the flag is JSON text, so a
    mapping may give the object itself. ``extra``: more metadata for the program (e.g. which algorithms use it).
    """
    return dataclasses.field(default=default, metadata={"help": help, "aliases": aliases, "choices": choices,
                                                        "metavar": metavar, "flag": flag, "kind": kind,
                                                        "resolved": resolved, "repeat": repeat, "keys": keys,
                                                        "json_text": json_text, **extra})


def setting(default: Any, doc: str, **extra):
    """A documented field that is not a flag: a key of a JSON/YAML option (e.g. --grpo-config), typed by its
    annotation."""
    return dataclasses.field(default=default, metadata={"doc": doc, **extra})


def doc_of(f: dataclasses.Field) -> str:
    return f.metadata.get("help") or f.metadata.get("doc") or ""


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
        """Short aliases, the long flag, then long aliases (older names): usage shows the first."""
        aliases = self.field.metadata["aliases"]
        return (*[a for a in aliases if not a.startswith("--")], self.long, *[a for a in aliases if a.startswith("--")])

    @property
    def keys(self) -> tuple[str, ...]:
        return field_keys(self.field)

    @property
    def where(self) -> str:
        return f"{self.owner.__name__}.{self.field.name}"

    @property
    def shown_default(self):
        """The default --help shows: the field's own for a resolved option (None there means "not given")."""
        meta = self.field.metadata
        shown = self.field.default if meta["resolved"] or meta.get("repeat") else self.parser_default
        return "not set" if shown is None else shown

    @property
    def help_text(self) -> str:
        """The help with one "(default: ...)": added unless the help already says what the default is."""
        text = self.field.metadata["help"]
        if re.search(r"\bdefault\b", text, re.IGNORECASE) or self.shown_default is dataclasses.MISSING:
            return text
        return f"{text} (default: {self.shown_default})"

    @property
    def parser_default(self):
        # argparse appends a repeated flag's values to its default: None, and the field's default when not given
        return None if self.field.metadata["resolved"] or self.field.metadata.get("repeat") else self.field.default


def base_type(annotation) -> tuple[type, bool]:
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
    return f.metadata.get("flag") or flag_name(f.name)


def _dest(f: dataclasses.Field) -> str:
    return _long(f).lstrip("-").replace("-", "_")


def field_dest(f: dataclasses.Field) -> str:
    """Where a field's flag puts its value (the argparse dest), and its YAML key."""
    return _dest(f)


def field_keys(f: dataclasses.Field) -> tuple[str, ...]:
    """Every name a field takes as a YAML/mapping key: its dest, its long aliases', older names (``keys``)."""
    long_aliases = [a[2:].replace("-", "_") for a in f.metadata.get("aliases", ()) if a.startswith("--")]
    return tuple(dict.fromkeys((_dest(f), *long_aliases, *f.metadata.get("keys", ()))))


def _walk(cls, path: tuple[str, ...]):
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if is_option(f):
            kind, optional = base_type(hint)
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
        names = [*opt.flags, *opt.keys]
        if opt.kind is bool:
            names += ["--no-" + name[2:] for name in opt.flags if name.startswith("--")]
        for name in dict.fromkeys(names):
            if name in taken:
                raise OptionClash(f"{cls.__name__}: {opt.where} would make {name!r}, which {taken[name]} already "
                                  "makes; give one of them another name (option(..., flag=...))")
            taken[name] = opt.where
    return found


def build_parser(cls, prog: str, description: str, defaults: dict | None = None) -> argparse.ArgumentParser:
    """The parser of ``cls``'s options; ``cls.retired_flags`` ({flag: what to use instead}) names flags another
    command spells the same way with another meaning. ``defaults`` (by dest): this command's own defaults, below
    ``--config`` and the flags, and named in their options' help."""
    defaults = defaults or {}
    parser = _ConfigFileParser(cls, prog=prog, description=f"{description} {UNDERSCORES_NOTE}".strip(),
                               retired=getattr(cls, "retired_flags", {}))
    parser.add_argument("--config", default=None, metavar="FILE.yaml",
                        help="YAML file of options (keys: the long flag names, e.g. learning_rate: 1e-4); "
                             "flags given on the command line win over it")
    groups = {(): parser}
    for opt in options(cls):
        if opt.path not in groups:  # a nested dataclass's flags are listed under its place in the tree
            groups[opt.path] = parser.add_argument_group(".".join(opt.path))
        meta = opt.field.metadata
        text = opt.help_text if opt.dest not in defaults else \
            f"{meta['help']} (default for {prog}: {defaults[opt.dest]})"
        common = dict(dest=opt.dest, default=defaults.get(opt.dest, opt.parser_default), help=text.replace("%", "%%"))
        if opt.kind is bool:
            groups[opt.path].add_argument(*opt.flags, action=RecordedBool, **common)
        elif meta.get("repeat"):
            groups[opt.path].add_argument(*opt.flags, action="append", type=opt.kind, metavar=meta["metavar"],
                                          **common)
        else:
            groups[opt.path].add_argument(*opt.flags, type=opt.kind, choices=meta["choices"], metavar=meta["metavar"],
                                          **common)
    return parser


class _ConfigFileParser(FlagParser):
    """Reads ``--config FILE.yaml`` into the defaults before parsing the flags, for every ``parse_args`` caller;
    the file's keys count as given (``given``), as flags do."""

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
            parsed = super().parse_known_args(args, namespace)
            self.given |= set(values)
            return parsed
        finally:  # the file's values are this call's defaults only
            self._defaults = saved[0]
            for action, default in saved[1].items():
                action.default = default


def _is_kind(value, kind) -> bool:
    if kind is bool:
        return isinstance(value, bool)
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def _number(value, kind):
    """YAML 1.1 reads 1e-3 as a string: a string that is a number of ``kind`` is taken as that number."""
    if kind in (float, int) and isinstance(value, str):
        try:
            return kind(value)
        except ValueError:
            return value
    return value


def kind_name(kind) -> str:
    if typing.get_origin(kind) is tuple:
        return f"a list of {typing.get_args(kind)[0].__name__}"
    return kind.__name__


def check_value(value, kind, optional: bool, where: str, choices: tuple | None = None, strings: bool = True):
    """``value`` as ``kind`` (a float may be given as an int, and with ``strings`` a number as a numeric string,
    as YAML 1.1 reads 1e-3; a ``tuple[X, ...]`` as a list of X), or one ConfigFileError line:
    ``<where> must be <kind>[ or null], got <value>``."""
    if value is None and optional:
        return None
    if typing.get_origin(kind) is tuple:
        item = typing.get_args(kind)[0]
        ok = isinstance(value, (list, tuple)) and all(_is_kind(v, item) for v in value)
        value = tuple(item(v) for v in value) if ok else value
    else:
        value = _number(value, kind) if strings else value
        ok = _is_kind(value, kind)
    if not ok:
        raise ConfigFileError(f"{where} must be {kind_name(kind)}{' or null' if optional else ''}, got {value!r}")
    if choices and value not in choices:
        raise ConfigFileError(f"{where} must be one of {', '.join(map(str, choices))}, got {value!r}")
    return float(value) if kind is float else value


def did_you_mean(word: str, names, hints: dict[str, str] | None = None) -> str:
    """`` (did you mean 'x' or 'y'?)`` for the one or two near misses of ``word`` among ``names`` (or a ``hints``
    entry), else ''."""
    if hints and word in hints:
        return f" (did you mean {hints[word]!r}?)"
    close = closest(word, names)
    return f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""


def key_index(cls) -> dict[str, Option]:
    """Every YAML/mapping key of ``cls``'s options (dests, long aliases' names, older names) -> its option."""
    return {key: opt for opt in options(cls) for key in opt.keys}


def unknown_key_hint(cls, key: str) -> str:
    """"did you mean" for a key of ``cls``: a near miss of a key, a short flag's name (``lr`` -> learning_rate), or
    a retired flag's replacement; else ''."""
    retired = {flag.lstrip("-").replace("-", "_"): text for flag, text in getattr(cls, "retired_flags", {}).items()}
    if key in retired:
        return f" ({retired[key]})"
    shorts = {alias.lstrip("-"): opt.dest for opt in options(cls) for alias in opt.field.metadata["aliases"]
              if not alias.startswith("--")}
    return did_you_mean(key, key_index(cls), shorts)


def check_values(cls, raw: dict, source: str) -> dict:
    """A mapping of option keys (``-`` or ``_``, any key name of the option) -> values by dest, each checked as
    its flag would be; a bad key or value is one ConfigFileError line starting with ``source``."""
    index = key_index(cls)
    values = {}
    for key, value in raw.items():
        name = str(key).replace("-", "_")
        if name not in index:
            raise ConfigFileError(f"{source} has unknown key {key!r}"
                                  + (unknown_key_hint(cls, name) or "; the keys are the long flag names of --help"))
        opt, where = index[name], f"{source} key {key!r}"
        if opt.field.metadata.get("repeat"):  # a list, or one value
            values[opt.dest] = [check_value(item, opt.kind, False, f"{where} item")
                                for item in (value if isinstance(value, list) else [value])]
            continue
        if opt.field.metadata["json_text"] and isinstance(value, (dict, list)):
            value = json.dumps(value)
        values[opt.dest] = check_value(value, opt.kind, opt.optional, where, opt.field.metadata["choices"])
    return values


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
    return check_values(cls, raw, f"--config {path}")


def defaults(cls) -> dict:
    """Every option's value when no flag, file or mapping gives it (by dest)."""
    return {opt.dest: opt.parser_default for opt in options(cls)}


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
