"""The device runtime: one API, two backends (``sim`` and ``cuda``).

``make_runtime("sim", seed=7, strategy="random")`` or ``make_runtime("cuda")``.
"""
from __future__ import annotations


from dataclasses import dataclass
from typing import Dict

from .. import seeds
from .sched import STRATEGIES, Diverged, Replay, Strategy, make_strategy


@dataclass(frozen=True)
class DeviceInfo:
    """What a device backend can do, known without building it (the runtime it builds
    carries the same flags: ``Runtime``)."""

    name: str
    runtime: str          # "module:Class"
    replayable: bool      # decisions recorded; a repro's choices replay exactly
    host_flags: bool      # device work can wait on host flags (logical tensor-parallel ranks)
    cpu_work: bool        # device work is CPU tensor ops: one intra-op thread is best
    gpu: bool             # a real accelerator (needs CUDA)
    collective: str       # torch.distributed backend of real tensor-parallel ranks


ACCESS_MODES = ("infer", "declared", "audit")   # how the detector learns a launch's accesses

DEVICES: Dict[str, DeviceInfo] = {
    "sim": DeviceInfo("sim", "overlapcheck.device.sim:SimRuntime", replayable=True,
                      host_flags=True, cpu_work=True, gpu=False, collective="gloo"),
    "cuda": DeviceInfo("cuda", "overlapcheck.device.cuda:CudaRuntime", replayable=False,
                       host_flags=False, cpu_work=False, gpu=True, collective="nccl"),
}


def device_info(name: str) -> DeviceInfo:
    """The backend called ``name`` (``ValueError``, one line, for an unknown one)."""
    try:
        return DEVICES[name]
    except KeyError:
        raise ValueError(f"unknown device {name!r} (choose from {', '.join(DEVICES)})") from None


def check_available(name: str) -> None:
    """``RuntimeError`` (one line) when the backend cannot run on this machine."""
    if device_info(name).gpu:
        import torch
        if not torch.cuda.is_available():
            raise RuntimeError(f"--device {name} needs a CUDA GPU and a CUDA build of torch")

# the runtime and buffers need torch: imported on first use, so that the command line
# answers `--help` and usage errors without loading torch
_LAZY = {**dict.fromkeys(("AnnotationError", "DuplicateWriteError", "Event",
                          "RaceError", "Runtime", "Stream", "StuckWait"), "api"),
         **dict.fromkeys(("DEVICE", "PAGEABLE", "PINNED", "Buffer", "Region", "is_poison",
                          "poison_value"), "buffers")}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = ["make_runtime", "device_info", "check_available", "DeviceInfo", "Runtime", "Stream", "Event", "Buffer", "Region",
           "AnnotationError", "DuplicateWriteError", "RaceError", "StuckWait", "Diverged", "Replay", "Strategy",
           "DEVICES", "STRATEGIES", "ACCESS_MODES", "DEVICE", "PINNED", "PAGEABLE",
           "is_poison", "poison_value"]


def make_runtime(device: str = "sim", seed: int = 0, strategy="random", detect: bool = True,
                 access: str = "infer", on_race: str = "collect", graphs: bool = False,
                 twins: str = "run") -> "Runtime":
    """Build a runtime. ``strategy`` is a name (see ``STRATEGIES``) or a ``Strategy``
    (used by replayable backends: the sim); its randomness is the ``schedule``
    sub-stream of ``seed``. ``graphs`` (a GPU backend; with the detector, declared
    accesses only): the engine's model calls replay from CUDA graphs. ``twins`` (a
    backend whose work is CPU tensor ops): ``run`` the kernels' host runs (their one
    source on numpy views, ``device/xp.py``), ``check`` each against the kernel on the
    tensors with the same inputs, or ``off`` (the kernels on the tensors only;
    ``device/twins.py``)."""
    import importlib
    from .twins import TWIN_MODES
    info = device_info(device)
    if graphs and not info.gpu:
        raise ValueError(f"CUDA graphs need a GPU device, not {device!r}")
    if twins not in TWIN_MODES:
        raise ValueError(f"unknown twins mode {twins!r} (choose from {', '.join(TWIN_MODES)})")
    module, cls = info.runtime.split(":")
    runtime = getattr(importlib.import_module(module), cls)
    if info.replayable:
        if isinstance(strategy, str):
            strategy = make_strategy(strategy, seeds.stream(seed, "schedule"))
        rt = runtime(strategy, detect=detect, access=access, on_race=on_race)
    else:
        rt = runtime(detect=detect, access=access, on_race=on_race, graphs=graphs)
    if twins == "off":
        rt.host_runs = False
    rt.check_twins = twins == "check" and rt.host_runs
    return rt
