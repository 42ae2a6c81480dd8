"""A user's own parts (policy losses, estimators, shapers, masks, filters, environments...) in every process.

A registry is a dict of name -> row in the process that imported it. A row that coati's own modules register is
there in every process (the module registers it when imported); a row a user's code registers exists only in the
process that ran that code. A Ray actor is another process, so two ways bring those rows to it, both applied by
``UserParts.load()`` at the start of every actor's process (coati/utils/actor_process.py), before it builds
anything:

- ``--plugins PATH_OR_MODULE`` (repeatable; a YAML list): files or importable modules that every process imports
  first, the driver included (before any flag or key is checked, so their names validate: a command's one door
  for that is coati/config/user_plugins.py). Their rows register
  themselves in each process, as coati's do. A file on every node at the same path, or a module installed there.
- rows registered anywhere else in the driver (the user's script, its ``__main__``, which a worker cannot import):
  every registration is noted here (``registrar`` / ``note_row``); building the run's config (coati/config/cli.py,
  for the command line and ``coati.run`` / ``coati.build_config`` alike) pickles the rows still registered then,
  by value (cloudpickle: their code travels, not a module name), into ``RLConfig.parts``, which every actor
  receives; each actor puts them back into the same tables (``install``) after importing the plugins. Such a
  row is registered before the config is built anyway: the config's names are validated against the tables.

Rows registered by coati's own packages and by ``--plugins`` modules are never shipped: each process has them.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
import traceback
from dataclasses import dataclass, field
from typing import Callable

from coati.utils.dataclass_cli import option

# Packages whose modules register their rows at import, in every process.
_OWN_PACKAGES = ("coati", "rewards")

# (table, name) -> (row, the module of its code, "kind name"), registered in this process by a user's code
_outside: dict[tuple[str, str], tuple[object, str, str]] = {}
_importing: list[str] = []  # the --plugins entries being imported now (their rows register in every process)
_imported: dict[str, object] = {}  # --plugins entry -> its module, in this process


class UserPartsError(ValueError):
    """A --plugins entry that cannot be imported, or rows that cannot travel; the message is the one line."""


class ShippedRows:
    """The rows ``ship`` pickled: names for the logs, the bytes for the actors (not a dataclass, so that a
    config's ``asdict`` keeps it whole and its text is the names)."""

    __slots__ = ("names", "blob")

    def __init__(self, names: tuple[str, ...], blob: bytes):
        self.names, self.blob = names, blob

    def __eq__(self, other):
        return isinstance(other, ShippedRows) and (self.names, self.blob) == (other.names, other.blob)

    def __hash__(self):
        return hash(self.names)

    def __repr__(self):
        return f"ShippedRows({', '.join(self.names)})"

    __str__ = __repr__


PLUGINS_HELP = ("your own parts: a .py file or an importable module (e.g. my_parts.py, my_pkg.parts) that every "
                "process of the run imports before it builds anything (the driver, producers, trainer ranks, the "
                "evaluator), so the policy losses, estimators, shapers, masks, filters, environments and reward kinds "
                "it registers are usable by name; repeatable (a YAML list). Not --plugin, the trainer's layout. Parts registered in "
                "a script calling coati.run need no flag: they travel to the actors (docs/algorithms.md)")


@dataclass(frozen=True)
class UserParts:
    plugins: tuple[str, ...] = option((), PLUGINS_HELP, kind=str, repeat=True, metavar="FILE.py|MODULE")
    # the driver's own rows (ship), filled in when the run's config is built; None: none shipped
    shipped: ShippedRows | None = field(default=None, compare=False)

    def __post_init__(self):  # files by their absolute paths: an actor's working directory is not the driver's
        object.__setattr__(self, "plugins", absolute(self.plugins))

    def load(self) -> None:
        """In an actor's process: import the plugins, then put the shipped rows back into their tables."""
        import_user_parts(self.plugins)
        if self.shipped is not None:
            install(self.shipped)

    def shipping(self) -> "UserParts":
        """These parts with the driver's own rows registered so far (``ship``)."""
        return UserParts(self.plugins, ship())


def _is_path(entry: str) -> bool:
    return entry.endswith(".py") or os.sep in entry or (os.altsep is not None and os.altsep in entry)


def absolute(entries) -> tuple[str, ...]:
    """The entries with each file as an absolute path: an actor's working directory is not the driver's."""
    return tuple(os.path.abspath(e) if _is_path(e) and os.path.isfile(e) else e for e in entries or ())


def _failure(entry: str, err: BaseException) -> str:
    """Where in the user's code an import failed: its last frame outside importlib, as file:line."""
    frames = [f for f in traceback.extract_tb(err.__traceback__) if "importlib" not in f.filename]
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return f"--plugins {entry}: importing it failed{where}: {type(err).__name__}: {err}"


def import_user_parts(entries) -> list:
    """Import each --plugins entry once in this process (a file by its path, else a module by its name); the
    modules. A missing file or module, or an import that fails, is one UserPartsError line naming the entry."""
    modules = []
    for entry in entries:
        key = os.path.abspath(entry) if _is_path(entry) else entry
        if key not in _imported:
            _importing.append(entry)
            try:
                _imported[key] = _import_one(entry)
            finally:
                _importing.pop()
        modules.append(_imported[key])
    return modules


def _import_one(entry: str):
    if _is_path(entry):
        if not os.path.isfile(entry):
            raise UserPartsError(f"--plugins {entry}: no such file (give a .py file's path, or a module name such as "
                                 "my_pkg.parts that `python -c 'import my_pkg.parts'` imports)")
        imported = _module_of_file(entry)
        if imported is not None:  # the script imported it itself: running it again would register twice
            return imported
        # a stable name per file, in sys.modules, so that its classes and functions pickle and dataclasses work
        name = "coati_user_parts_" + re.sub(r"\W", "_", os.path.abspath(entry))
        spec = importlib.util.spec_from_file_location(name, entry)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as err:
            del sys.modules[name]
            raise UserPartsError(_failure(entry, err)) from None
        return module
    try:
        return importlib.import_module(entry)
    except ModuleNotFoundError as err:
        if err.name and entry.startswith(err.name):  # the entry itself, not an import inside it
            raise UserPartsError(f"--plugins {entry}: no module named {err.name!r} here (a file's path must end in "
                                 ".py; a module must be importable: installed, or under the working directory)"
                                 ) from None
        raise UserPartsError(_failure(entry, err)) from None
    except Exception as err:
        raise UserPartsError(_failure(entry, err)) from None


def _module_of_file(path: str):
    """The module already imported from the file at ``path``, if any."""
    path = os.path.realpath(path)
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if file and os.path.realpath(file) == path:
            return module
    return None


def _module_of(obj) -> str:
    return getattr(obj, "__module__", None) or ""


def note_row(table: str, kind: str, name: str, row, code=None) -> None:
    """A registry added ``row`` (a ``kind``, e.g. "policy loss") under ``name`` to ``table`` (``"module:ATTRIBUTE"``
    of the dict); ``code``: the function or class it runs (default: the row itself). Rows of a user's code outside
    --plugins are kept, to be shipped."""
    module = _module_of(row if code is None else code)
    if _importing or module.split(".")[0] in _OWN_PACKAGES:
        return
    _outside[(table, name)] = (row, module, f"{kind} {name}")


def registrar(registry: dict, kind: str, table: str) -> Callable[[str], Callable]:
    """``register(name)``: a decorator that files the function (or class) under ``name`` in ``registry``, the
    dict at ``table`` (``"module:ATTRIBUTE"``), once per name."""

    def register(name: str):
        def decorate(fn):
            if name in registry:
                raise ValueError(f"{kind} {name!r} is already registered")
            registry[name] = fn
            note_row(table, kind, name, fn)
            return fn

        return decorate

    return register


def _table(table: str) -> dict:
    module, _, attribute = table.partition(":")
    return getattr(importlib.import_module(module), attribute)


def outside_rows() -> dict:
    """(table, name) -> row of the user's rows still registered as they were (a row deleted or replaced since
    is not the user's any more)."""
    return {key: row for key, (row, _, _) in _outside.items()
            if key[0].partition(":")[0] in sys.modules and _table(key[0]).get(key[1]) is row}


def ship() -> ShippedRows | None:
    """The user's rows registered in this process, pickled by value; None when there are none."""
    import cloudpickle

    rows = outside_rows()
    if not rows:
        return None
    names = tuple(_outside[key][2] for key in rows)
    # their code by value, also from a module of the user's (a worker may not find it): cloudpickle pickles
    # functions of an importable module by reference unless the module is registered for this call
    modules = {_outside[key][1] for key in rows}
    registered = [sys.modules[m] for m in modules
                  if m in sys.modules and m != "__main__" and m not in cloudpickle.list_registry_pickle_by_value()]
    for module in registered:
        cloudpickle.register_pickle_by_value(module)
    try:
        blob = cloudpickle.dumps(rows)
    except Exception as err:
        raise UserPartsError(f"your own parts ({', '.join(names)}) cannot be sent to the Ray actors ({type(err).__name__}: "
                             f"{err}): put them in a file and pass it as --plugins FILE.py") from None
    finally:
        for module in registered:
            cloudpickle.unregister_pickle_by_value(module)
    return ShippedRows(names, blob)


def install(shipped: ShippedRows) -> None:
    """Put shipped rows into this process's tables (after the plugins: a row may use their code)."""
    import pickle

    try:
        rows = pickle.loads(shipped.blob)
    except Exception as err:
        raise UserPartsError(f"the parts registered in the driver's own code ({', '.join(shipped.names)}) cannot be "
                             f"loaded in this actor ({type(err).__name__}: {err}); a module they use must be "
                             "installed on every node, or put them in a file passed as --plugins FILE.py") from None
    for (table, name), row in rows.items():
        _table(table)[name] = row
