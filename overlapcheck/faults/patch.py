"""The source-patch mechanism: a fault restores the pre-fix source of functions of a real
engine, the way SGLang's own ``SGLANG_DEBUG_REVERT_PR`` switch reverts a fix.

A ``FunctionPatch`` names a function (``"module:Qualified.name"``) and ``(fixed,
pre-fix)`` text pairs, indented as in the engine's file: each fixed text must occur
exactly once in the installed source, or ``build`` raises ``PatchMismatch`` naming the
function, so a fault never silently becomes a no-op on another engine version. The
function is recompiled from the edited source in its own module's namespace, with its
file name and line numbers (a traceback points into the engine's file), a method inside
a class body of its class's name (zero-argument ``super()`` and name mangling work as
in the original); nothing is executed but the compile. A decorated function is refused
(its decorator would be lost).

A ``SourcePatch`` (a fault's mechanism) is one or more function patches. Its target
chooses how they are put in place:

* ``bound(obj)``: the patched methods bound to one instance (``setattr(obj, name,
  ...)``): that object alone runs them, any other instance of the class, before, during
  or after, the original (vLLM: one scheduler per session). Calls through ``super()``
  resolve on the class and would bypass it: ``bind`` refuses a method that a subclass
  between the object's class and the patched one overrides;
* ``installed()``: the function replaced in its owner and in every module of the
  engine's package that imported it by name, for the duration of a block (SGLang:
  module-level functions, and methods reached through several objects).
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import sys
import textwrap
import types
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, Iterator, List, Tuple

Edits = Tuple[Tuple[str, str], ...]


class PatchMismatch(RuntimeError):
    """The installed source does not fit a patch (a fixed text not found exactly once,
    not a plain function, a decorated one)."""


@dataclass(frozen=True)
class FunctionPatch:
    target: str         # "module:Qualified.name", e.g. "vllm.v1.core.sched.scheduler:Scheduler.schedule"
    edits: Edits        # (fixed text, pre-fix text), indented as in the file

    @property
    def module(self) -> str:
        return self.target.split(":")[0]

    @property
    def qualname(self) -> str:
        return self.target.split(":")[1]

    def resolve(self, importer: Callable[[str], object] = importlib.import_module):
        """(module, owner, attribute, the original function): the owner is the module or
        the class the function is defined in. ``importer`` imports the module when it is
        not imported yet (a target whose engine needs stubs to import passes its own)."""
        mod = sys.modules.get(self.module) or importer(self.module)
        owner, parts = mod, self.qualname.split(".")
        for p in parts[:-1]:
            owner = getattr(owner, p)
        attr = parts[-1]
        orig = owner.__dict__.get(attr) if isinstance(owner, type) else getattr(owner, attr, None)
        return mod, owner, attr, orig

    def build(self, importer: Callable[[str], object] = importlib.import_module):
        """The pre-fix function (unbound). Built once per patch and process (reading and
        recompiling an engine's method costs about 0.1 s, more than a short run); it is
        never modified, only installed or bound."""
        return _build(self, importer)

    def bind(self, obj) -> None:
        """Bind the pre-fix method to ``obj`` alone."""
        cls_name = self.qualname.split(".")[-2] if "." in self.qualname else None
        attr = self.qualname.split(".")[-1]
        for klass in type(obj).__mro__:
            if klass.__name__ == cls_name:
                break
            if attr in klass.__dict__:
                raise PatchMismatch(f"{klass.__name__} overrides {self.qualname}: an instance "
                                    f"patch of the base method would not run")
        setattr(obj, attr, types.MethodType(self.build(), obj))

    def unbind(self, obj) -> None:
        obj.__dict__.pop(self.qualname.split(".")[-1], None)

    def install(self, importer: Callable[[str], object] = importlib.import_module) -> list:
        """Put the pre-fix function in place of the original in its owner and in every
        module of the engine's package holding the original by name; returns what
        ``uninstall`` puts back."""
        mod, owner, attr, orig = self.resolve(importer)
        new = self.build(importer)
        package = self.module.split(".")[0] + "."
        holders = [owner] + [m for n, m in list(sys.modules.items())
                             if n.startswith(package) and m is not None and m is not owner
                             and getattr(m, "__dict__", {}).get(attr) is orig]
        saved = []
        for h in holders:
            saved.append((h, attr, orig))
            setattr(h, attr, new)
        return saved


def uninstall(saved: list) -> None:
    for h, attr, orig in reversed(saved):
        setattr(h, attr, orig)


@functools.lru_cache(maxsize=None)
def _build(patch: FunctionPatch, importer):
    mod, owner, attr, orig = patch.resolve(importer)
    if not inspect.isfunction(orig):
        raise PatchMismatch(f"{patch.target} is not a plain function")
    src = inspect.getsource(orig)
    if src.lstrip().startswith("@"):
        raise PatchMismatch(f"{patch.target} is decorated: a recompiled copy would lose it")
    for fixed, prefix in patch.edits:
        fixed = fixed.lstrip("\n").rstrip()
        n = src.count(fixed)
        if n != 1:
            raise PatchMismatch(f"patch of {patch.target}: the fixed text occurs {n} times in "
                                f"the installed source (expected once): "
                                f"{fixed.splitlines()[0].strip()!r}")
        src = src.replace(fixed, prefix.lstrip("\n").rstrip())
    src = textwrap.dedent(src)
    _, line = inspect.getsourcelines(orig)
    filename = inspect.getsourcefile(orig) or patch.module
    cls = owner if isinstance(owner, type) else None
    if cls is not None:
        # inside a class body of the class's name: a zero-argument super() finds
        # __class__, private names mangle as in the original
        wrapped = f"class {cls.__name__}:\n" + textwrap.indent(src, "    ")
        code = compile("\n" * max(line - 2, 0) + wrapped, filename, "exec")
        body = next(c for c in code.co_consts if isinstance(c, types.CodeType))
    else:
        body = compile("\n" * max(line - 1, 0) + src, filename, "exec")
    code = next(c for c in body.co_consts if isinstance(c, types.CodeType) and c.co_name == attr)
    closure = None
    if code.co_freevars:
        if code.co_freevars != ("__class__",) or cls is None:
            raise PatchMismatch(f"patch of {patch.target}: unexpected free variables "
                                f"{code.co_freevars}")
        closure = (types.CellType(cls),)
    fn = types.FunctionType(code, mod.__dict__, attr, orig.__defaults__, closure)
    fn.__kwdefaults__ = orig.__kwdefaults__
    fn.__qualname__ = f"{patch.qualname}[pre-fix]"
    return fn


@dataclass(frozen=True)
class SourcePatch:
    """A fault's mechanism: the pre-fix source of ``functions``."""

    functions: Tuple[FunctionPatch, ...]
    kind = "source-patch"

    @classmethod
    def of(cls, target: str, *edits: Tuple[str, str]) -> "SourcePatch":
        """The patch of one function."""
        return cls((FunctionPatch(target, tuple(edits)),))

    def sites(self) -> Tuple[str, ...]:
        return tuple(f.target for f in self.functions)

    def fields(self, fault) -> dict:
        # the targets' listing named the public fix "pr"
        return {"pr": fault.cites}


def merged(faults: Iterable) -> Tuple[FunctionPatch, ...]:
    """The function patches of ``faults`` (``Fault``s with a ``SourcePatch``), merged
    per function: two faults editing the same function are one patch with both edits."""
    edits: Dict[str, List[Tuple[str, str]]] = {}
    for f in faults:
        for p in f.mechanism.functions:
            edits.setdefault(p.target, []).extend(p.edits)
    return tuple(FunctionPatch(t, tuple(e)) for t, e in edits.items())


@contextlib.contextmanager
def bound(obj, patches: Iterable[FunctionPatch]) -> Iterator[None]:
    """``patches`` bound to ``obj`` for the duration of the block."""
    done: List[FunctionPatch] = []
    try:
        for p in patches:
            p.bind(obj)
            done.append(p)
        yield
    finally:
        for p in reversed(done):
            p.unbind(obj)


@contextlib.contextmanager
def installed(patches: Iterable[FunctionPatch],
              importer: Callable[[str], object] = importlib.import_module) -> Iterator[None]:
    """``patches`` installed (``FunctionPatch.install``) for the duration of the block."""
    saved: list = []
    try:
        for p in patches:
            saved.extend(p.install(importer))
        yield
    finally:
        uninstall(saved)
