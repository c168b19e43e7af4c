"""SGLang's functions re-compiled from their own source with exact text edits: the
one source-patch mechanism (``overlapcheck/faults/patch.py``) bound to SGLang 0.5.23.

Behind the target's faults (a fixed bug's pre-fix source) and the CUDA path on the CPU
shim (a platform test that picks SGLang's CUDA branch). SGLang's modules import only
with the stubs of its CUDA-only modules in place (``env.stubbed``), and a patched
function is installed in every SGLang module that holds it by any name.
"""
from __future__ import annotations

import contextlib
from typing import Dict, Iterator, Sequence, Tuple

from ...faults import patch as shared

Edit = Tuple[str, str]      # (exact text, replacement)
PACKAGE = "sglang."
ENGINE = "SGLang 0.5.23"


def _import(modname: str):
    from . import env
    with env.stubbed():        # SGLang's import needs the stubs of its CUDA-only modules
        return __import__(modname, fromlist=["_"])


def resolve(target: str):
    """``(module, owner, attribute, original)`` of ``"module:Qualified.name"``."""
    return shared.resolve(target, _import)


def edited(target: str, edits: Sequence[Edit], label: str, extra: Dict[str, object] = None):
    """``(owner, attribute, original, edited function)``; ``label`` names the patch in
    errors and in the compiled code's file name."""
    return shared.recompiled(target, edits, label, importer=_import, extra=extra, engine=ENGINE)


@contextlib.contextmanager
def installed(patches: Sequence[Tuple[object, str, object, object]]) -> Iterator[None]:
    """Install each ``(owner, attribute, original, replacement)`` where the original
    is (its owner, and every name an SGLang module holds it by: ``from m import f as
    _f`` included); undo on exit."""
    with shared.replaced(patches, PACKAGE):
        yield
