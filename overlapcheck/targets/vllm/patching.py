"""Reverse patches: a method of the installed vLLM recompiled from its own source with
a fix taken out, bound to ONE scheduler instance.

A ``Revert`` names a class, a method and ``(fixed, prefix)`` text pairs: each fixed
text must occur exactly once in the method's source and is replaced by the pre-fix
text (SGLang's ``DEBUG_REVERT_PR`` idea, applied to scheduler code). When the source
no longer matches, ``apply`` raises ``PatchMismatch`` naming the revert: a fault never
silently becomes a no-op on another vLLM version.

The patched function is bound to the instance (``setattr(scheduler, name, ...)``), so
it shadows the class's method for that scheduler only: another scheduler in the same
process, before, during or after the session, runs the unmodified code. ``unapply``
removes the instance attribute. (Calls through ``super()`` resolve on the class and
would bypass an instance patch: the reverts here patch methods called as
``self.name(...)``; ``apply`` refuses a method the class's subclasses override.)
"""
from __future__ import annotations

import functools
import inspect
import textwrap
import types
from dataclasses import dataclass
from typing import Tuple


class PatchMismatch(RuntimeError):
    """The installed source does not contain a revert's fixed text exactly once."""


@dataclass(frozen=True)
class Revert:
    module: str                          # e.g. "vllm.v1.core.sched.scheduler"
    cls: str                             # e.g. "Scheduler"
    method: str
    edits: Tuple[Tuple[str, str], ...]   # (fixed text, pre-fix text), indented as in the file


def _compile(src: str, filename: str, firstline: int, name: str) -> types.CodeType:
    # compiled inside a class body so that a zero-argument super() would find __class__
    wrapped = "class _Revert:\n" + textwrap.indent(src, "    ")
    code = compile("\n" * max(firstline - 2, 0) + wrapped, filename, "exec")
    body = next(c for c in code.co_consts if isinstance(c, types.CodeType))
    return next(c for c in body.co_consts if isinstance(c, types.CodeType) and c.co_name == name)


@functools.lru_cache(maxsize=None)
def build(rv: Revert):
    """The reverted function (unbound). Built once per revert and process: reading and
    recompiling a method of vLLM's scheduler costs about 0.1 s, more than a short run; the
    function is never modified, only bound to one scheduler per session."""
    import importlib
    mod = importlib.import_module(rv.module)
    cls = getattr(mod, rv.cls)
    orig = cls.__dict__.get(rv.method)
    if not inspect.isfunction(orig):
        raise PatchMismatch(f"{rv.cls}.{rv.method} is not a plain method of {rv.module}")
    src = inspect.getsource(orig)
    for fixed, prefix in rv.edits:
        fixed = fixed.lstrip("\n").rstrip()
        n = src.count(fixed)
        if n != 1:
            raise PatchMismatch(f"revert of {rv.cls}.{rv.method}: the fixed text occurs {n} "
                                f"times in the installed source (expected once): "
                                f"{fixed.splitlines()[0].strip()!r}")
        src = src.replace(fixed, prefix.lstrip("\n").rstrip())
    src = textwrap.dedent(src)
    _, line = inspect.getsourcelines(orig)
    code = _compile(src, inspect.getsourcefile(orig) or rv.module, line, rv.method)
    closure = None
    if code.co_freevars:
        if code.co_freevars != ("__class__",):
            raise PatchMismatch(f"revert of {rv.cls}.{rv.method}: unexpected free variables "
                                f"{code.co_freevars}")
        closure = (types.CellType(cls),)
    fn = types.FunctionType(code, mod.__dict__, rv.method, orig.__defaults__, closure)
    fn.__kwdefaults__ = orig.__kwdefaults__
    fn.__qualname__ = f"{rv.cls}.{rv.method}[reverted]"
    return fn


def apply(obj, rv: Revert) -> None:
    """Bind the reverted method to ``obj`` alone."""
    fn = build(rv)
    for klass in type(obj).__mro__:
        if klass.__name__ == rv.cls:
            break
        if rv.method in klass.__dict__:
            raise PatchMismatch(f"{klass.__name__} overrides {rv.cls}.{rv.method}: "
                                f"an instance patch of the base method would not run")
    setattr(obj, rv.method, types.MethodType(fn, obj))


def unapply(obj, rv: Revert) -> None:
    obj.__dict__.pop(rv.method, None)
