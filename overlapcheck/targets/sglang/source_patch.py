"""Functions of SGLang re-compiled from their own source with exact text edits.

The mechanism behind the target's faults (a fixed bug's pre-fix source) and behind the
CUDA path on the CPU shim (a platform test that picks SGLang's CUDA branch): the
function's source, as indented in its file, gets each edit (the edit's text must match
exactly once, or the patch refuses to apply: not SGLang 0.5.23), is compiled in the
function's own module namespace (plus ``extra`` names) and is installed in place of
the original in every SGLang module that imported it by name, for the duration of a
block (``installed``). Nothing is written to SGLang's files.
"""
from __future__ import annotations

import contextlib
import inspect
import sys
import textwrap
from typing import Dict, Iterator, List, Sequence, Tuple

Edit = Tuple[str, str]      # (exact text, replacement)


def resolve(target: str):
    """``(module, owner, attribute, original)`` of ``"module:Qualified.name"``."""
    modname, qual = target.split(":")
    mod = sys.modules.get(modname)
    if mod is None:
        from . import env
        with env.stubbed():        # SGLang's import needs the stubs of its CUDA-only modules
            mod = __import__(modname, fromlist=["_"])
    owner, parts = mod, qual.split(".")
    for p in parts[:-1]:
        owner = getattr(owner, p)
    return mod, owner, parts[-1], owner.__dict__[parts[-1]] if isinstance(owner, type) \
        else getattr(owner, parts[-1])


def edited(target: str, edits: Sequence[Edit], label: str, extra: Dict[str, object] = None):
    """``(owner, attribute, original, edited function)``; ``label`` names the patch in
    errors and in the compiled code's file name."""
    mod, owner, attr, orig = resolve(target)
    src = inspect.getsource(orig)
    for old, new in edits:
        n = src.count(old)
        if n != 1:
            raise RuntimeError(f"{label}: its edit matches {n} times in {target} (expected "
                               f"once): not SGLang 0.5.23?")
        src = src.replace(old, new)
    ns: dict = {}
    glb = mod.__dict__ if not extra else {**mod.__dict__, **extra}
    exec(compile(textwrap.dedent(src), f"<overlapcheck {label}>", "exec"), glb, ns)
    fn = ns[attr]
    if extra and isinstance(fn, type(edited)):
        # the edited function looks its globals up in a copy: keep the module's live
        # names visible (a name the module rebinds later is seen), extras on top
        fn = _rebind(fn, mod.__dict__, extra)
    return owner, attr, orig, fn


class _Globals(dict):
    """A function's globals: ``extra`` first, then the module's live namespace."""

    def __init__(self, module_dict: dict, extra: dict):
        super().__init__(extra)
        self._module = module_dict

    def __missing__(self, key):
        return self._module[key]


def _rebind(fn, module_dict: dict, extra: dict):
    import types
    g = _Globals(module_dict, extra)
    g["__builtins__"] = module_dict.get("__builtins__", __builtins__)
    return types.FunctionType(fn.__code__, g, fn.__name__, fn.__defaults__, fn.__closure__)


_SCAN: Dict[tuple, list] = {}


def _holders(origs: frozenset, modules: int) -> list:
    """``(module, name, value)`` for every SGLang module name bound to one of
    ``origs``; kept per (originals, number of SGLang modules loaded), so a run's
    repeated installs do not rescan SGLang's modules (a scan costs about 0.1 s)."""
    key = (origs, modules)
    hit = _SCAN.get(key)
    if hit is None:
        ids = {id(o) for o in origs}
        hit = [(m, name, v) for n, m in list(sys.modules.items())
               if n.startswith("sglang.") and m is not None
               for name, v in list(getattr(m, "__dict__", {}).items())
               if id(v) in ids and v in origs]
        if len(_SCAN) > 64:
            _SCAN.clear()
        _SCAN[key] = hit
    return hit


@contextlib.contextmanager
def installed(patches: Sequence[Tuple[object, str, object, object]]) -> Iterator[None]:
    """Install each ``(owner, attribute, original, replacement)`` where the original
    is (its owner, and every name an SGLang module holds it by: ``from m import f as
    _f`` included); undo on exit."""
    saved: List[Tuple[object, str, object]] = []
    try:
        by_id = {id(orig): new for owner, attr, orig, new in patches}
        for owner, attr, orig, new in patches:
            saved.append((owner, attr, orig))
            setattr(owner, attr, new)
        origs = frozenset(orig for _, _, orig, _ in patches)
        loaded = sum(1 for n in list(sys.modules) if n.startswith("sglang."))
        for m, name, orig in _holders(origs, loaded):
            if getattr(m, "__dict__", {}).get(name) is orig:
                saved.append((m, name, orig))
                setattr(m, name, by_id[id(orig)])
        yield
    finally:
        for h, attr, orig in reversed(saved):
            setattr(h, attr, orig)
