"""Targets: the engines overlapcheck drives and checks alike.

``TARGETS`` maps a name to the class that adapts it (imported on first use, so that
the command line answers without importing an engine); ``get(name)`` builds it. The
reference engine is always there; the others need their engine installed (an
optional extra) and say how to install it when it is missing.
"""
from __future__ import annotations

import importlib
from typing import Dict

from ..protocol.target import Target

# name -> "module:Class"
TARGETS: Dict[str, str] = {
    "reference": "overlapcheck.engine.target:ReferenceTarget",
    "vllm": "overlapcheck.targets.vllm:VllmTarget",
    "sglang": "overlapcheck.targets.sglang:SglangTarget",
}

__all__ = ["TARGETS", "get"]


def get(name: str) -> Target:
    """The target called ``name`` (``ValueError``, one line, for an unknown name)."""
    try:
        module, cls = TARGETS[name].split(":")
    except KeyError:
        raise ValueError(f"unknown target {name!r} (choose from {', '.join(TARGETS)})") from None
    return getattr(importlib.import_module(module), cls)()
