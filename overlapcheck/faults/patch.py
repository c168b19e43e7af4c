"""The source-patch mechanism: a fault restores the pre-fix source of functions of a real
engine, the way SGLang's own ``SGLANG_DEBUG_REVERT_PR`` switch reverts a fix.

A ``FunctionPatch`` names a function (``"module:Qualified.name"``) and ``(fixed,
pre-fix)`` text pairs, indented as in the engine's file: each fixed text must occur
exactly once in the installed source, or ``build`` raises ``PatchMismatch`` naming the
function, so a fault never silently becomes a no-op on another engine version. The
function is recompiled from the edited source in its own module's namespace, with its
file name and line numbers (a traceback points into the engine's file), a method inside
a class body of its class's name (zero-argument ``super()`` and name mangling work as
in the original); only its definition runs (decorators and defaults, as at import).
This one compile (``recompiled``) is behind every source edit of a real engine: the
faults here, and the targets' platform edits and upstream fixes.

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
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

Edits = Tuple[Tuple[str, str], ...]


class PatchMismatch(RuntimeError):
    """The installed source does not fit a patch (a fixed text not found exactly once,
    not a plain function, a decorated one)."""


Importer = Callable[[str], object]


def resolve(target: str, importer: Importer = importlib.import_module):
    """``(module, owner, attribute, original)`` of ``"module:Qualified.name"``: the owner
    is the module or the class the function is defined in (None where it has no such
    attribute). ``importer`` imports the module when it is not imported yet (a target
    whose engine needs stubs to import passes its own)."""
    modname, qual = target.split(":")
    mod = sys.modules.get(modname) or importer(modname)
    owner, parts = mod, qual.split(".")
    for p in parts[:-1]:
        owner = getattr(owner, p)
    attr = parts[-1]
    orig = owner.__dict__.get(attr) if isinstance(owner, type) else getattr(owner, attr, None)
    return mod, owner, attr, orig


def recompiled(target: str, edits: Sequence[Tuple[str, str]], label: str, *,
               importer: Importer = importlib.import_module, extra: Optional[dict] = None,
               engine: str = "the engine", filename: Optional[str] = None):
    """``(owner, attribute, original, edited function)`` of ``target``: its source as
    indented in its file (decorators included), each ``(text, replacement)`` of
    ``edits`` applied where the text occurs exactly once (``PatchMismatch`` otherwise:
    not the pinned ``engine``), executed as a definition in the function's own module
    namespace (plus ``extra`` names, the module's live names below them) at its first
    line's number, for a method inside a class body of its class's name with its
    ``__class__`` cell pointed at the real class (zero-argument ``super()`` and name
    mangling work as in the original). Only the definition runs (its decorators and
    default values, as at the module's import); ``filename`` (default
    ``<overlapcheck LABEL>``) is what a traceback shows."""
    mod, owner, attr, orig = resolve(target, importer)
    try:
        src = inspect.getsource(orig)
        _, line = inspect.getsourcelines(orig)
    except (TypeError, OSError):
        raise PatchMismatch(f"{label}: {target} has no source to edit") from None
    for old, new in edits:
        n = src.count(old)
        if n != 1:
            first = (old.strip().splitlines() or [""])[0].strip()
            raise PatchMismatch(f"{label}: its edit matches {n} times in {target} (expected "
                                f"once: not {engine}?): {first!r}")
        src = src.replace(old, new)
    src = textwrap.dedent(src)
    filename = filename or f"<overlapcheck {label}>"
    glb = mod.__dict__ if not extra else _Globals(mod.__dict__, extra)
    ns: dict = {}
    cls = owner if isinstance(owner, type) else None
    if cls is None:
        exec(compile("\n" * max(line - 1, 0) + src, filename, "exec"), glb, ns)
        return owner, attr, orig, ns[attr]
    wrapped = f"class {cls.__name__}:\n" + textwrap.indent(src, "    ")
    exec(compile("\n" * max(line - 2, 0) + wrapped, filename, "exec"), glb, ns)
    stand_in = ns[cls.__name__]
    new = stand_in.__dict__[attr]
    _point_class_cells(new, stand_in, cls)
    return owner, attr, orig, new


def _point_class_cells(obj, stand_in: type, cls: type) -> None:
    """The ``__class__`` cells of ``obj`` (a function, the functions it wraps, a
    static or class method's function) hold ``cls`` instead of ``stand_in``."""
    seen = set()
    while obj is not None and id(obj) not in seen:
        seen.add(id(obj))
        fn = getattr(obj, "__func__", obj)
        for cell in getattr(fn, "__closure__", None) or ():
            try:
                if cell.cell_contents is stand_in:
                    cell.cell_contents = cls
            except ValueError:      # an empty cell
                pass
        obj = getattr(fn, "__wrapped__", None)


def helpers(names: Sequence[Tuple[str, str]]) -> Dict[str, object]:
    """``extra`` names for ``recompiled`` from ``(name, "module:attribute")`` pairs."""
    out = {}
    for name, where in names:
        mod, attr = where.split(":")
        out[name] = getattr(importlib.import_module(mod), attr)
    return out


class _Globals(dict):
    """A recompiled function's globals: ``extra`` first, then the module's live
    namespace (a name the module rebinds later is seen)."""

    def __init__(self, module_dict: dict, extra: dict):
        super().__init__(extra)
        self._module = module_dict
        self["__builtins__"] = module_dict.get("__builtins__", __builtins__)

    def __missing__(self, key):
        return self._module[key]


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

    def resolve(self, importer: Importer = importlib.import_module):
        """(module, owner, attribute, the original function) (``patch.resolve``)."""
        return resolve(self.target, importer)

    def build(self, importer: Importer = importlib.import_module):
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

    def install(self, importer: Importer = importlib.import_module) -> list:
        """Put the pre-fix function in place of the original in its owner and in every
        module of the engine's package holding it by any name; returns what
        ``uninstall`` puts back."""
        _, owner, attr, orig = self.resolve(importer)
        return install_all([(owner, attr, orig, self.build(importer))],
                           self.module.split(".")[0] + ".")


def uninstall(saved: list) -> None:
    for h, attr, orig in reversed(saved):
        setattr(h, attr, orig)


@functools.lru_cache(maxsize=None)
def _build(patch: FunctionPatch, importer):
    # the fixed texts as written in the fault's table (surrounding blank lines and
    # trailing spaces dropped); a traceback points into the engine's own file
    edits = [(fixed.lstrip("\n").rstrip(), prefix.lstrip("\n").rstrip())
             for fixed, prefix in patch.edits]
    _, _, _, orig = patch.resolve(importer)
    try:
        filename = inspect.getsourcefile(orig) or patch.module
    except TypeError:
        filename = patch.module
    fn = recompiled(patch.target, edits, f"patch of {patch.target}", importer=importer,
                    filename=filename)[3]
    if inspect.isfunction(fn):
        fn.__qualname__ = f"{patch.qualname}[pre-fix]"
    return fn


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


def install_all(patches: Sequence[Tuple[object, str, object, object]],
                package: Optional[str] = None) -> list:
    """Install each ``(owner, attribute, original, replacement)`` where the original
    is: its owner, and, with ``package`` (``"sglang."``), every name a module of that
    package holds it by (``from m import f as _f`` included); returns what
    ``uninstall`` puts back."""
    saved: List[Tuple[object, str, object]] = []
    try:
        by_id = {id(orig): new for owner, attr, orig, new in patches}
        for owner, attr, orig, new in patches:
            setattr(owner, attr, new)
            saved.append((owner, attr, orig))
        if package:
            origs = frozenset(orig for _, _, orig, _ in patches)
            loaded = sum(1 for n in list(sys.modules) if n.startswith(package))
            for m, name, orig in _holders(origs, package, loaded):
                if getattr(m, "__dict__", {}).get(name) is orig:
                    setattr(m, name, by_id[id(orig)])
                    saved.append((m, name, orig))
    except BaseException:
        uninstall(saved)
        raise
    return saved


@contextlib.contextmanager
def replaced(patches: Sequence[Tuple[object, str, object, object]],
             package: Optional[str] = None) -> Iterator[None]:
    """``install_all`` for the duration of the block."""
    saved = install_all(patches, package)
    try:
        yield
    finally:
        uninstall(saved)


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
