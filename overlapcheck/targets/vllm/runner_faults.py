"""Faults in vLLM's V2 model runner (``layer: "runner"``), applied for one run.

Each restores the pre-fix source of one function of the runner, as the scheduler
faults revert scheduler methods: the function's source gets each edit (each must match
exactly once, or the fault refuses to apply: not vLLM 0.33.0), is compiled in its
module's namespace and installed in its place while the block runs (the one
source-patch mechanism, ``overlapcheck/faults/patch.py``; the patched functions are
methods, held by their class alone). Nothing is written to vLLM's files.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

from ...faults import patch as source_patch
from .faults import FAULTS

ENGINE = "vLLM 0.33.0"


@contextlib.contextmanager
def applied(names) -> Iterator[None]:
    """The named runner faults in place for the block (other faults are ignored)."""
    import importlib

    mine = [n for n in names if FAULTS[n].extra["layer"] == "runner"]
    patches = []
    for n in mine:
        for fp in FAULTS[n].mechanism.functions:
            importlib.import_module(fp.module)
            patches.append(source_patch.recompiled(fp.target, fp.edits, f"fault {n}",
                                                   engine=ENGINE))
    with source_patch.replaced(patches):
        yield
