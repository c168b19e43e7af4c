"""The device runtime: one API, two backends (``sim`` and ``cuda``).

``make_runtime("sim", seed=7, strategy="random")`` or ``make_runtime("cuda")``.
"""
from __future__ import annotations


from typing import TYPE_CHECKING

from .. import seeds
from .sched import STRATEGIES, Diverged, Replay, Strategy, make_strategy

DEVICES = ("sim", "cuda")

if TYPE_CHECKING:
    from .api import Runtime

# the runtime and buffers need torch: imported on first use, so that the command line
# answers `--help` and usage errors without loading torch
_LAZY = {**dict.fromkeys(("ACCESS_MODES", "AnnotationError", "DuplicateWriteError", "Event",
                          "RaceError", "Runtime", "Stream", "StuckWait"), "api"),
         **dict.fromkeys(("DEVICE", "PAGEABLE", "PINNED", "Buffer", "Region", "is_poison",
                          "poison_value"), "buffers")}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = ["make_runtime", "Runtime", "Stream", "Event", "Buffer", "Region",
           "AnnotationError", "DuplicateWriteError", "RaceError", "StuckWait", "Diverged", "Replay", "Strategy",
           "DEVICES", "STRATEGIES", "ACCESS_MODES", "DEVICE", "PINNED", "PAGEABLE",
           "is_poison", "poison_value"]


def make_runtime(device: str = "sim", seed: int = 0, strategy="random", detect: bool = True,
                 access: str = "infer", on_race: str = "collect", graphs: bool = False) -> "Runtime":
    """Build a runtime. ``strategy`` is a name (see ``STRATEGIES``) or a ``Strategy``
    (sim only); its randomness is the ``schedule`` sub-stream of ``seed``. ``graphs``
    (cuda, detector off): the engine's model calls replay from CUDA graphs."""
    if graphs and device != "cuda":
        raise ValueError(f"CUDA graphs need the cuda device, not {device!r}")
    if device == "sim":
        from .sim import SimRuntime
        if isinstance(strategy, str):
            strategy = make_strategy(strategy, seeds.stream(seed, "schedule"))
        return SimRuntime(strategy, detect=detect, access=access, on_race=on_race)
    if device == "cuda":
        from .cuda import CudaRuntime
        return CudaRuntime(detect=detect, access=access, on_race=on_race, graphs=graphs)
    raise ValueError(f"unknown device {device!r} (choose from {', '.join(DEVICES)})")
