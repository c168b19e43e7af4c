"""Faults in vLLM's V2 model runner (``layer: "runner"``), applied for one run.

Each restores the pre-fix source of one function of the runner, as the scheduler
faults revert scheduler methods: the function's source gets each edit (each must match
exactly once, or the fault refuses to apply: not vLLM 0.33.0), is compiled in its
module's namespace and installed in its place while the block runs
(``sglang.source_patch``, the project's mechanism for source edits). Nothing is
written to vLLM's files.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

from .faults import FAULTS


@contextlib.contextmanager
def applied(names) -> Iterator[None]:
    """The named runner faults in place for the block (other faults are ignored)."""
    import importlib

    from ..sglang import source_patch
    for n in names:
        if FAULTS[n].layer == "runner":
            importlib.import_module(FAULTS[n].target.split(":")[0])
    patches = [source_patch.edited(FAULTS[n].target, FAULTS[n].edits, f"fault {n}")
               for n in names if FAULTS[n].layer == "runner"]
    with source_patch.installed(patches):
        yield
