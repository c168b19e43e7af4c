"""Where ``watch`` gets its events from: the registry of backends, known without torch.

* ``cuda``: PyTorch's GPU trace callbacks on a real GPU (``gpu.GpuBackend``);
* ``cpu``: a shim giving ``torch.cuda`` streams, events, device tensors and pinned
  memory a CPU meaning for the duration of the block (``shim.ShimBackend``): the same
  verdicts without a GPU, since happens-before does not depend on timing.

``auto`` picks the first backend that needs a GPU when one is usable, else the first
that does not.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Dict


@dataclass(frozen=True)
class WatchBackend:
    name: str
    cls: str          # "module:Class", built with the tracker
    gpu: bool         # needs a CUDA GPU


BACKENDS: Dict[str, WatchBackend] = {
    "cpu": WatchBackend("cpu", "overlapcheck.watch.shim:ShimBackend", gpu=False),
    "cuda": WatchBackend("cuda", "overlapcheck.watch.gpu:GpuBackend", gpu=True),
}
AUTO = "auto"
DEVICES = (AUTO,) + tuple(BACKENDS)
MODES = ("raise", "log", "collect")


def check_device(device: str) -> None:
    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r} (choose from {', '.join(DEVICES)})")


def resolve(device: str, gpu_available: bool) -> WatchBackend:
    """The backend for ``device`` (``auto`` resolved); ``RuntimeError`` (one line) when it
    needs a GPU this machine lacks."""
    check_device(device)
    if device == AUTO:
        return next(b for b in BACKENDS.values() if b.gpu == gpu_available)
    b = BACKENDS[device]
    if b.gpu and not gpu_available:
        others = [n for n, x in BACKENDS.items() if not x.gpu]
        raise RuntimeError(f"watch device {device!r} needs a CUDA GPU; --device "
                           f"{others[0]} runs the same checks on the CPU")
    return b


def build(backend: WatchBackend, tracker):
    module, cls = backend.cls.split(":")
    return getattr(importlib.import_module(module), cls)(tracker)
