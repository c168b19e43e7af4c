"""Functions of a real engine re-compiled from their own source with exact text edits.

The mechanism behind the real engines' source-patch faults that run under ``watch``
(SGLang's, the vLLM runner's), and behind SGLang's CUDA path on the CPU shim (a
platform test that picks the CUDA branch): the function's source, as indented in its
file, gets each edit (the edit's text must match exactly once, or the patch refuses to
apply: ``PatchMismatch``, the engine is not the pinned version), is compiled in the
function's own module namespace (plus ``extra`` names) and is installed in place of
the original, for the duration of a block (``installed``): in its owner and, for a
package named, in every module of that package that holds it by any name (``from m
import f as _f`` included). Nothing is written to the engine's files. A target binds
it to its engine (how the engine's modules import, which package to scan): SGLang's
``targets/sglang/source_patch.py``.
"""
from __future__ import annotations

import contextlib
import importlib
import inspect
import sys
import textwrap
import types
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from ..faults.patch import PatchMismatch

Edit = Tuple[str, str]      # (exact text, replacement)
Importer = Callable[[str], object]


def resolve(target: str, importer: Importer = importlib.import_module):
    """``(module, owner, attribute, original)`` of ``"module:Qualified.name"``;
    ``importer`` imports the module when it is not imported yet."""
    modname, qual = target.split(":")
    mod = sys.modules.get(modname)
    if mod is None:
        mod = importer(modname)
    owner, parts = mod, qual.split(".")
    for p in parts[:-1]:
        owner = getattr(owner, p)
    return mod, owner, parts[-1], owner.__dict__[parts[-1]] if isinstance(owner, type) \
        else getattr(owner, parts[-1])


def edited(target: str, edits: Sequence[Edit], label: str, extra: Dict[str, object] = None,
           importer: Importer = importlib.import_module, engine: str = "the engine"):
    """``(owner, attribute, original, edited function)``; ``label`` names the patch in
    errors and in the compiled code's file name; ``engine`` names the pinned engine
    version in the error of an edit that does not match once."""
    mod, owner, attr, orig = resolve(target, importer)
    src = inspect.getsource(orig)
    for old, new in edits:
        n = src.count(old)
        if n != 1:
            raise PatchMismatch(f"{label}: its edit matches {n} times in {target} (expected "
                                f"once): not {engine}?")
        src = src.replace(old, new)
    ns: dict = {}
    glb = mod.__dict__ if not extra else {**mod.__dict__, **extra}
    exec(compile(textwrap.dedent(src), f"<overlapcheck {label}>", "exec"), glb, ns)
    fn = ns[attr]
    if extra and isinstance(fn, types.FunctionType):
        # the edited function looks its globals up in a copy: keep the module's live
        # names visible (a name the module rebinds later is seen), extras on top
        fn = _rebind(fn, mod.__dict__, extra)
    return owner, attr, orig, fn


def helpers(names: Sequence[Tuple[str, str]]) -> Dict[str, object]:
    """``extra`` names for ``edited`` from ``(name, "module:attribute")`` pairs."""
    out = {}
    for name, where in names:
        mod, attr = where.split(":")
        out[name] = getattr(importlib.import_module(mod), attr)
    return out


class _Globals(dict):
    """A function's globals: ``extra`` first, then the module's live namespace."""

    def __init__(self, module_dict: dict, extra: dict):
        super().__init__(extra)
        self._module = module_dict

    def __missing__(self, key):
        return self._module[key]


def _rebind(fn, module_dict: dict, extra: dict):
    g = _Globals(module_dict, extra)
    g["__builtins__"] = module_dict.get("__builtins__", __builtins__)
    return types.FunctionType(fn.__code__, g, fn.__name__, fn.__defaults__, fn.__closure__)


_SCAN: Dict[tuple, list] = {}


def _holders(origs: frozenset, package: str, modules: int) -> list:
    """``(module, name, value)`` for every module of ``package`` (its name and a dot)
    with a name bound to one of ``origs``; kept per (originals, package, number of its
    modules loaded), so a run's repeated installs do not rescan the engine's modules (a
    scan costs about 0.1 s)."""
    key = (origs, package, modules)
    hit = _SCAN.get(key)
    if hit is None:
        ids = {id(o) for o in origs}
        hit = [(m, name, v) for n, m in list(sys.modules.items())
               if n.startswith(package) and m is not None
               for name, v in list(getattr(m, "__dict__", {}).items())
               if id(v) in ids and v in origs]
        if len(_SCAN) > 64:
            _SCAN.clear()
        _SCAN[key] = hit
    return hit


@contextlib.contextmanager
def installed(patches: Sequence[Tuple[object, str, object, object]],
              package: Optional[str] = None) -> Iterator[None]:
    """Install each ``(owner, attribute, original, replacement)`` where the original
    is: its owner, and, with ``package`` (``"sglang."``), every name a module of that
    package holds it by; undo on exit."""
    saved: List[Tuple[object, str, object]] = []
    try:
        by_id = {id(orig): new for owner, attr, orig, new in patches}
        for owner, attr, orig, new in patches:
            saved.append((owner, attr, orig))
            setattr(owner, attr, new)
        if package:
            origs = frozenset(orig for _, _, orig, _ in patches)
            loaded = sum(1 for n in list(sys.modules) if n.startswith(package))
            for m, name, orig in _holders(origs, package, loaded):
                if getattr(m, "__dict__", {}).get(name) is orig:
                    saved.append((m, name, orig))
                    setattr(m, name, by_id[id(orig)])
        yield
    finally:
        for h, attr, orig in reversed(saved):
            setattr(h, attr, orig)
