"""The one place a command imports a user's ``--plugins`` (coati/utils/user_parts.py), before anything asks a
registry: a name those files register (a reward kind, a policy loss, an estimator, a shaper, a mask, a filter, an
environment) is then a valid ``-rt`` choice, ``--reward-weights`` name, ``--grpo-config`` value or ``--env``
wherever it is given, on the line or in a ``--config`` YAML.

Every entry point calls one of these first: ``load_line_plugins(argv)`` (the line's ``--plugins``, else its
``--config`` file's ``plugins:``; coati train/ppo, rl_example.py, coati evaluate, coati sft/rm), or
``load_user_plugins(plugins_of_mapping(mapping))`` (a mapping's ``plugins`` key: coati.build_config and
coati.run, an RLHF pipeline's ppo section; config/cli.py's config_from_dict).
"""

from __future__ import annotations

import argparse
import os

from coati.config.errors import ConfigError
from coati.utils.user_parts import UserPartsError, import_user_parts


def plugins_of_mapping(mapping: dict | None) -> list[str]:
    """The ``plugins`` entries of a mapping of option keys (one string, or a list of strings); a value of another
    shape is none here: the mapping's own check refuses it, in its words."""
    value = (mapping or {}).get("plugins")
    entries = [value] if isinstance(value, str) else value
    if isinstance(entries, (list, tuple)) and all(isinstance(entry, str) for entry in entries):
        return list(entries)
    return []


def config_file_plugins(path: str | None) -> list[str]:
    """The ``plugins:`` entries of a ``--config`` YAML file; a missing or malformed file has none here (its parser
    says what is wrong with it)."""
    import yaml

    if not path or not os.path.isfile(path):
        return []
    try:
        with open(path, encoding="utf-8") as handle:
            raw = yaml.safe_load(handle)
    except (OSError, yaml.YAMLError):
        return []
    return plugins_of_mapping(raw) if isinstance(raw, dict) else []


def plugins_of_line(argv: list[str] | None) -> tuple[str | None, list[str], list[str]]:
    """(the line's ``--config`` file or None, that file's ``plugins:``, the line's ``--plugins``), read before the
    line is parsed; ``argv`` None: this process's arguments. The line's ``--plugins`` replace the file's, as any
    flag's value replaces the file's (the parsed option, which the actors import, holds the line's alone)."""
    reader = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    reader.add_argument("--config", default=None)
    reader.add_argument("--plugins", action="append", default=[])
    known = reader.parse_known_args(argv)[0]
    return known.config, [] if known.plugins else config_file_plugins(known.config), known.plugins


def load_user_plugins(entries=(), source: str | None = None) -> None:
    """Import ``entries`` in this process (each once: a second call with the same entries costs nothing). A file
    that is missing or fails to import is one ConfigError line naming it, prefixed with ``source`` (where the
    entry was written, e.g. ``--config run.yaml``) when given."""
    try:
        import_user_parts(entries)
    except UserPartsError as err:
        raise ConfigError(f"{source}: {err}" if source else str(err)) from None


def load_line_plugins(argv: list[str] | None) -> None:
    """A command line's plugins imported before it is parsed: its own ``--plugins``, else its ``--config`` file's."""
    config, from_file, from_line = plugins_of_line(argv)
    load_user_plugins(from_file, f"--config {config}")
    load_user_plugins(from_line)
