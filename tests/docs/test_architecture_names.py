"""docs/architecture.md held against the code: its "Registered today" lists name exactly what the registries hold;
every source file of coati/ and rewards/ is named on it and every file it names exists; a GRPO step's path is the
code's calls in order; and the rules it names (imports point down the rooms, no comparison against a registered
name, where engines are built, who reads the staleness, what producers ship) hold."""

from __future__ import annotations

import ast
import functools
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


# --- Every source file on the map -------------------------------------------------------------------------------
#
# Which files must be named: every `.py` under coati/ and rewards/, except a package's face: an `__init__.py` that
# defines nothing (no function, no class, no name besides `__all__`): it only hands names on.
#
# How the map names a file, read from its backticked spans: a path from the repository root
# (`coati/trainer/learner.py`), a path from coati/ (`trainer/learner.py`), a module and a name in it
# (`layouts/base.layout_of`), or, on a line that names a folder (`coati/trainer/`: a room's row, a line of the
# index), a file of that folder by its own name (`learner.py`, `rule.choose_layout`).

SOURCE_ROOTS = ("coati", "rewards")
FOLDER = re.compile(r"^(?:coati|rewards)(?:/\w+)*/$")
PY_PATH = re.compile(r"(?<![\w/.-])((?:\w+/)*\w+)\.py\b")
MODULE_NAME = re.compile(r"(?<![\w/.-])((?:\w+/)*[a-z_]\w*)\.[A-Za-z_]\w*")


@functools.lru_cache(maxsize=None)
def parsed(path: str) -> ast.Module:
    """A source file's syntax tree, ``path`` from the repository root (read once for every test here)."""
    with open(os.path.join(ROOT, path)) as handle:
        return ast.parse(handle.read())


def defines_something(path: str) -> bool:
    for node in parsed(path).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return True
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AnnAssign, ast.AugAssign)) else []
        if any(not (isinstance(target, ast.Name) and target.id == "__all__") for target in targets):
            return True
    return False


def source_files() -> set[str]:
    found = set()
    for top in SOURCE_ROOTS:
        for folder, _, names in os.walk(os.path.join(ROOT, top)):
            for name in names:
                if not name.endswith(".py"):
                    continue
                path = os.path.relpath(os.path.join(folder, name), ROOT)
                if name != "__init__.py" or defines_something(path):
                    found.add(path)
    return found


def coati_rooms() -> set[str]:
    return {name for name in os.listdir(os.path.join(ROOT, "coati")) if os.path.isdir(os.path.join(ROOT, "coati", name))}


def map_names() -> tuple[set[str], list[str]]:
    """(the source files the map names, the names that look like a source file and are none)."""
    rooms = coati_rooms()
    named, broken = set(), []
    for line in re.split(r"\n(?! )", architecture()):  # a list item with its indented continuation lines is one
        spans = re.findall(r"`([^`]+)`", line)
        folders = [span for span in spans if FOLDER.match(span)]
        for span in spans:
            candidates = [(match, True) for match in PY_PATH.findall(span)]
            candidates += [(match, False) for match in MODULE_NAME.findall(span) if not match.endswith("/")]
            for stem, is_file in candidates:
                first = stem.split("/")[0]
                if "/" in stem and first in SOURCE_ROOTS:
                    places = [stem + ".py"]
                elif "/" in stem and first in rooms:
                    places = ["coati/" + stem + ".py"]
                elif "/" not in stem and folders and not os.path.exists(os.path.join(ROOT, stem + ".py")):
                    places = [folder + stem + ".py" for folder in folders]
                else:
                    continue  # a name outside the source (a user's file.py, examples/, tests/, a config key)
                hits = [place for place in places if os.path.exists(os.path.join(ROOT, place))]
                named.update(hits)
                if not hits and (is_file or "/" in stem):
                    broken.append(f"{span} (on the line naming {folders})" if folders else span)
    return named, broken


def test_every_source_file_is_on_the_map():
    named, _ = map_names()
    unnamed = sorted(source_files() - named)
    assert not unnamed, (f"docs/architecture.md does not name {len(unnamed)} source files: {unnamed}; add each to its "
                         "room's row or to 'Every other file, by folder' with a few words on what it is")


def test_every_file_the_map_names_exists():
    _, broken = map_names()
    assert not broken, f"docs/architecture.md names source files that do not exist: {sorted(set(broken))}"


# --- The step's path --------------------------------------------------------------------------------------------

STEP_HEAD = re.compile(r"opens these (\d+) files, in the order it runs through them")
STEP_ITEM = re.compile(r"^\d+\. `((?:coati|rewards)/[\w/]+\.py)`: ([^;]+);", re.MULTILINE)
STEP_DEF = re.compile(r"`([\w.]+)`(?: as `(\w+)`)?")


def step_path() -> tuple[int, list[tuple[str, str, str]]]:
    """(the count the map claims, [(file, definition, the name its caller calls it by)] in the map's order)."""
    text = architecture()
    head = STEP_HEAD.search(text)
    assert head, "docs/architecture.md no longer says which files a GRPO step opens"
    section = text[head.end():text.index("\n## ", head.end())]
    hops = [(path, name, called or name.split(".")[-1])
            for path, chain in STEP_ITEM.findall(section) for name, called in STEP_DEF.findall(chain)]
    return int(head.group(1)), hops


def definitions(path: str) -> dict:
    """``name`` / ``Class.name`` -> its function node (or the class's body for a class), of a source file."""
    tree = parsed(path)
    found = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found[node.name] = node
        elif isinstance(node, ast.ClassDef):
            found[node.name] = node
            for member in node.body:
                if isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    found[f"{node.name}.{member.name}"] = member
    return found


def calls(node) -> set[str]:
    """The names a definition calls: ``f(...)``, ``x.f(...)``."""
    return {call.func.id if isinstance(call.func, ast.Name) else call.func.attr for call in ast.walk(node)
            if isinstance(call, ast.Call) and isinstance(call.func, (ast.Name, ast.Attribute))}


def test_the_steps_path_is_the_code_in_order():
    claimed, hops = step_path()
    files = list(dict.fromkeys(path for path, _, _ in hops))
    assert len(files) == claimed, f"the map says a GRPO step opens {claimed} files and lists {len(files)}: {files}"
    assert hops[0][:2] == ("coati/trainer/learner.py", "Learner.train_step"), hops[0]
    callers = []
    for path, name, called in hops:
        assert os.path.exists(os.path.join(ROOT, path)), f"the step's path names {path}, which does not exist"
        node = definitions(path).get(name)
        assert node is not None, f"the step's path names {name} in {path}, which defines no such function"
        if callers:
            assert any(called in calls(caller) for caller in callers), (
                f"the step's path says {path} {name} is called as {called!r} by a function above it; none calls it")
        callers.append(node)


# --- The rules the map names ------------------------------------------------------------------------------------

def module_imports(path: str) -> list[tuple[int, str]]:
    """(line, module) of every import in a source file, those inside functions too (a lazy import is an arrow)."""
    tree = parsed(path)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def room_floors() -> dict[str, int]:
    """The rooms table: a room as a module prefix (``coati.trainer``, ``coati.cli``, ``rewards``) -> its floor."""
    floors = {}
    for floor, rooms in re.findall(r"^\| (\d+) \| ([^|]+) \|", architecture(), re.MULTILINE):
        for room in re.findall(r"`([^`]+)`", rooms):
            floors[room.rstrip("/").removesuffix(".py").replace("/", ".")] = int(floor)
    return floors


def room_of(module: str, floors: dict[str, int]) -> str | None:
    parts = module.split(".")
    return next((".".join(parts[:k]) for k in (2, 1) if ".".join(parts[:k]) in floors), None)


def test_every_import_points_down_the_room_table():
    # "a room imports only rooms on lower rows (or its own row)"; farm-studio checks circles
    floors = room_floors()
    unplaced, upward = [], []
    for path in sorted(source_files()):
        module = path.removesuffix(".py").replace("/", ".")  # coati/__init__.py: the room `coati/__init__.py`
        room = room_of(module, floors)
        if room is None:
            unplaced.append(path)
            continue
        upward += [f"{path}:{line} imports {name} (floor {floors[room]} -> {floors[room_of(name, floors)]})"
                   for line, name in module_imports(path)
                   if room_of(name, floors) and floors[room_of(name, floors)] > floors[room]]
    assert not unplaced, f"source files in no room of docs/architecture.md's table: {unplaced}"
    assert not upward, f"imports that run up the room table: {upward}"


REGISTRY_FILES = ("coati/registry/", "coati/layouts/registry.py", "rewards/builtin.py")


def test_no_file_compares_against_a_registered_name():
    # "No other file compares against one of these names: it asks the part's row"
    from coati.registry.plugins import PLUGIN_FAMILIES

    names = set(BACKENDS) | set(PLUGINS) | set(PLUGIN_FAMILIES) | set(WEIGHT_SYNCS) | set(REWARD_TYPES) | set(LAYOUTS)

    def strings(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.value
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            for element in node.elts:
                yield from strings(element)

    found = []
    for path in sorted(source_files()):
        if path.startswith(REGISTRY_FILES):
            continue
        tree = parsed(path)
        for node in ast.walk(tree):
            sides = [node.left, *node.comparators] if isinstance(node, ast.Compare) else \
                [node.value] if isinstance(node, ast.MatchValue) else []
            found += [f"{path}:{node.lineno} {name!r}" for side in sides for name in strings(side) if name in names]
    assert not found, f"comparisons against a registered part's name outside its registry: {found}"


def test_producers_ship_no_advantages():
    # "Producers ship rewards and behaviour logprobs, never advantages": a RolloutGroup has no such field
    group = next(node for node in parsed("coati/rollout/group.py").body if isinstance(node, ast.ClassDef) and node.name == "RolloutGroup")
    fields = {node.target.id for node in group.body if isinstance(node, ast.AnnAssign)}
    assert {"rewards", "logprobs"} <= fields, fields
    assert not {field for field in fields if "advantage" in field}, fields


# "Every engine a run's actor loads is built by rollout/engine_guard.build_engine ... Three places make a
# TransformersBackend themselves": who calls an engine's class or a row's build function by name, or resolves a
# row's wraps_trained_module (engine_guard.py resolves a row's build: no name to read)
ENGINE_MAKERS = {"TransformersBackend", "VLLMBackend", "build_transformers_backend", "build_vllm_backend"}
MAKES_ITS_OWN_ENGINE = {
    "coati/rollout/inference_backend.py", "coati/rollout/vllm_backend.py",  # the rows' build functions themselves
    "coati/trainer/colocated.py", "coati/rlhf/evaluate.py", "coati/demo/math_demo.py", "coati/demo/tool_demo.py",
}


def test_engines_are_built_where_the_map_says():
    makers = set()
    for path in source_files():
        tree = parsed(path)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.id if isinstance(func, ast.Name) else \
                func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else None
            resolved = name == "resolve" and node.args and ast.unparse(node.args[0]).endswith(".wraps_trained_module")
            if name in ENGINE_MAKERS or resolved:
                makers.add(path)
    assert makers == MAKES_ITS_OWN_ENGINE, (f"engines built outside rollout/engine_guard.build_engine: "
                                           f"{sorted(makers - MAKES_ITS_OWN_ENGINE)}; no longer: "
                                           f"{sorted(MAKES_ITS_OWN_ENGINE - makers)}")


def test_only_the_schedule_reads_the_staleness():
    # "RolloutSchedule ... owns the rule between producers and trainers ... none re-derives the rule": outside the
    # config that holds it, only cluster/schedule.py reads max_staleness
    readers = sorted({path for path in source_files() if not path.startswith(("coati/config/", "coati/cluster/schedule.py"))
                      for node in ast.walk(parsed(path))
                      if isinstance(node, (ast.Attribute, ast.Name, ast.keyword))
                      and "max_staleness" in (getattr(node, "attr", None), getattr(node, "id", None),
                                              getattr(node, "arg", None))})
    assert not readers, f"files that read max_staleness themselves instead of asking RolloutSchedule: {readers}"
