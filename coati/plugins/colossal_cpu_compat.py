"""Runtime fixes that let ColossalAI 0.5.0 train on CPU (gloo) with torch 2.13; nothing installed is edited.

ColossalAI selects its ``CpuAccelerator`` by itself when no GPU is present, and ``TorchDDPPlugin`` trains as
is, but the other plugins reach CUDA-only code paths. ``apply()`` monkeypatches, once per process and only
when the accelerator is the CPU one, exactly these upstream symptoms:

| fix | upstream symptom (unpatched, CPU) |
|---|---|
| ``rng_state`` | HybridParallelPlugin TP: ``CpuAccelerator.get_rng_state`` calls ``torch.get_rng_state(device)``, a TypeError (the function takes no device); ``manual_seed``/``seed``/... raise "not supported for cpu accelerator" |
| ``streams`` | LowLevelZero/Hybrid ZeRO: ``Stream()``, ``current_stream()``, ``stream()``, ``synchronize()`` raise "not supported for cpu accelerator" (the bucket store builds a comm stream) |
| ``hccl_available`` | HybridParallelPlugin PP: ``torch.distributed.is_hccl_available`` does not exist in CPU torch builds (AttributeError in pipeline p2p) |
| ``current_device`` | HybridParallelPlugin PP: p2p compares a received tensor's device index with ``current_device()``, which raises on CPU |
| ``zero_device_check`` | LowLevelZeroPlugin: ``LowLevelZeroOptimizer._sanity_checks`` asserts the accelerator is cuda/npu ("device is required"); the dtype check is kept |

ZeRO on CPU must also run with ``overlap_communication=False`` (a plugin argument, not a patch: the overlap
path needs real streams); ``colossal.py`` passes it. Each fix has a test in tests/plugins/test_colossal_compat.py.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class Fix:
    name: str
    symptom: str
    apply: Callable[[], None]


class _CpuStream:
    """Stands in for a CUDA stream on CPU: every operation is already synchronous."""

    def wait_stream(self, stream) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def record_event(self, event=None):
        return event or _CpuEvent()

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


class _CpuEvent:
    def record(self, stream=None) -> None:
        pass

    def wait(self, stream=None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, other) -> float:
        return 0.0


def _cpu_accelerator_cls():
    from colossalai.accelerator.cpu_accelerator import CpuAccelerator

    return CpuAccelerator


def _fix_rng_state() -> None:
    cls = _cpu_accelerator_cls()
    cls.get_rng_state = lambda self, device=None: torch.get_rng_state()
    cls.set_rng_state = lambda self, new_state, device=None: torch.set_rng_state(new_state)
    cls.get_rng_state_all = lambda self: [torch.get_rng_state()]
    cls.set_rng_state_all = lambda self, new_states: torch.set_rng_state(new_states[0])
    cls.manual_seed = lambda self, seed: torch.manual_seed(seed)
    cls.manual_seed_all = lambda self, seed: torch.manual_seed(seed)
    cls.seed = lambda self: torch.seed()
    cls.seed_all = lambda self: torch.seed()
    cls.initial_seed = lambda self: torch.initial_seed()


def _fix_streams() -> None:
    cls = _cpu_accelerator_cls()
    default = _CpuStream()
    cls.Stream = lambda self, device=None, priority=0, **kwargs: _CpuStream()
    cls.Event = lambda self, enable_timing=False, blocking=False, interprocess=False: _CpuEvent()
    cls.current_stream = lambda self, device=None: default
    cls.default_stream = lambda self, device=None: default
    cls.set_stream = lambda self, stream_: None
    cls.stream = lambda self, stream_: contextlib.nullcontext()
    cls.synchronize = lambda self, device=None: None
    cls.empty_cache = lambda self: None


def _fix_hccl_available() -> None:
    import torch.distributed as dist

    if not hasattr(dist, "is_hccl_available"):
        dist.is_hccl_available = lambda: False


def _fix_current_device() -> None:
    # None == the index of a CPU tensor's device, so "move to the current device" checks become no-ops.
    _cpu_accelerator_cls().current_device = lambda self: None


def _fix_zero_device_check() -> None:
    from colossalai.accelerator import get_accelerator
    from colossalai.zero.low_level.low_level_optim import LowLevelZeroOptimizer

    original = LowLevelZeroOptimizer._sanity_checks
    if getattr(original, "_coati_cpu_compat", False):
        return

    def _sanity_checks(self):
        accelerator = get_accelerator()
        if accelerator.name != "cpu":
            return original(self)
        for group in self.optim.param_groups:
            for param in group["params"]:
                if not getattr(param, "skip_zero_check", False):
                    assert param.dtype == self._dtype, \
                        f"Parameters are expected to have the same dtype `{self._dtype}`, but got `{param.dtype}`"

    _sanity_checks._coati_cpu_compat = True
    LowLevelZeroOptimizer._sanity_checks = _sanity_checks


FIXES = (
    Fix("rng_state", "CpuAccelerator.get_rng_state(device) -> TypeError: get_rng_state() takes 0 positional "
        "arguments (HybridParallelPlugin TP)", _fix_rng_state),
    Fix("streams", "CpuAccelerator.Stream/current_stream/stream/synchronize -> RuntimeError: this method is not "
        "supported for cpu accelerator (ZeRO bucket store, pipeline)", _fix_streams),
    Fix("hccl_available", "AttributeError: module 'torch.distributed' has no attribute 'is_hccl_available' "
        "(pipeline p2p)", _fix_hccl_available),
    Fix("current_device", "CpuAccelerator.current_device -> RuntimeError: this method is not supported for cpu "
        "accelerator (pipeline p2p object receive)", _fix_current_device),
    Fix("zero_device_check", "AssertionError: device is required (LowLevelZeroOptimizer._sanity_checks on CPU)",
        _fix_zero_device_check),
)

_applied: list[str] = []


def needed() -> bool:
    """True when ColossalAI would run on its CPU accelerator in this process."""
    from colossalai.accelerator import get_accelerator

    return get_accelerator().name == "cpu"


def apply(force: bool = False) -> list[str]:
    """Apply every fix once (only on the CPU accelerator unless ``force``); the names of the fixes in force."""
    if not (force or needed()):
        return []
    for fix in FIXES:
        if fix.name not in _applied:
            fix.apply()
            _applied.append(fix.name)
    return list(_applied)
