"""``overlapcheck watch``: the happens-before race detector over unmodified PyTorch code.

    from overlapcheck.watch import watch

    with watch(device="cpu"):        # or "cuda" on a GPU, or "auto"
        engine.step()                # plain torch.cuda code: streams, events, pinned copies

Streams, events, waits, synchronizations, allocations and frees come from PyTorch's
GPU trace callbacks (``gpu``) or from a CPU shim of ``torch.cuda`` (``shim``); op
reads and writes from a dispatch mode (``mode``); host reads that bypass the
dispatcher from patched accessors (``host``). The tracker (``tracker``) turns them
into the plain events of ``overlapcheck.race.Detector``; reports (``report``) name
both accesses at the user's lines and the missing synchronization. ``command`` is
``overlapcheck watch -- python script.py``; ``fixture`` the pytest fixture.

Importing this package does not import torch.
"""
from __future__ import annotations

__all__ = ["watch", "Watch", "RaceFound", "WatchReport", "run_program"]

_LAZY = {"watch": "session", "Watch": "session", "RaceFound": "session",
         "WatchReport": "report", "run_program": "runner"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
