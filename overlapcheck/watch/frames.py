"""The user's frames: where an access, an allocation or a stream came from.

A frame belongs to the user unless its file lies in torch, in NumPy (a watched NumPy
view's reads are the caller's), in overlapcheck's watch or race packages, or in
Python's own library (runpy, contextlib, ...). Reports show the innermost user frame
as ``file:line`` and a short stack of user frames under it. The stack ends where
overlapcheck's own entry points called the program (``overlapcheck watch -- python
prog.py``): what called them (the ``overlapcheck`` launcher an installer writes, a
shell's ``python -m``) is not the program's.
"""
from __future__ import annotations

import os
import sys
import sysconfig
from types import FrameType
from typing import Dict, Optional, Tuple

_HERE = os.path.dirname(os.path.abspath(__file__))
_PKG = os.path.dirname(_HERE)
_RACE = os.path.join(_PKG, "race")
_ENTRY = tuple(os.path.join(_PKG, n) for n in ("cli.py", "__main__.py"))
_CALLERS = (_HERE + os.sep, *_ENTRY)  # overlapcheck code that runs a program it watches


def _roots() -> Tuple[Tuple[str, ...], Tuple[str, ...]]:
    """(packages that are never the user's, Python's library directories)."""
    ours = [_HERE + os.sep, _RACE + os.sep, *_ENTRY]
    for name in ("torch", "numpy"):
        mod = sys.modules.get(name)
        if mod is not None and getattr(mod, "__file__", None):
            ours.append(os.path.dirname(os.path.abspath(mod.__file__)) + os.sep)
    stdlib = {os.path.abspath(p) + os.sep for k, p in sysconfig.get_paths().items()
              if k in ("stdlib", "platstdlib") and p}
    return tuple(ours), tuple(stdlib)


class Frames:
    """Finds user frames; the verdict per file is cached. With ``user_roots`` (the
    directories of the code under test, e.g. an engine's package), only files under
    them are the user's: a driver calling the engine is not."""

    def __init__(self, user_roots: Tuple[str, ...] = ()) -> None:
        self._ours, self._stdlib = _roots()
        self._only = tuple(os.path.abspath(r) + os.sep for r in user_roots)
        self._user: Dict[str, bool] = {}
        self._shown: Dict[str, str] = {}
        self._cwd = os.getcwd() + os.sep

    def is_user(self, filename: str) -> bool:
        v = self._user.get(filename)
        if v is None:
            if self._only:
                v = filename.startswith(self._only)
            else:
                installed = ("site-packages" in filename or "dist-packages" in filename)
                v = not (filename.startswith("<") or filename.startswith(self._ours)
                         or (filename.startswith(self._stdlib) and not installed))
            self._user[filename] = v
        return v

    def show(self, filename: str) -> str:
        """A file name as reports print it: relative to the working directory when
        under it, else the base name."""
        s = self._shown.get(filename)
        if s is None:
            path = os.path.abspath(filename)
            root = next((r for r in self._only if path.startswith(r)), None)
            if root is not None:    # under a user root: the path inside its package
                s = os.path.join(os.path.basename(root[:-1]), path[len(root):])
            else:
                s = path[len(self._cwd):] if path.startswith(self._cwd) else os.path.basename(path)
            self._shown[filename] = s
        return s

    def user_frame(self) -> Optional[FrameType]:
        """The innermost user frame of the current call stack."""
        f = sys._getframe(1)
        while f is not None and not self.is_user(f.f_code.co_filename):
            f = f.f_back
        return f

    def site(self, f: Optional[FrameType]) -> str:
        if f is None:
            return "?"
        return f"{self.show(f.f_code.co_filename)}:{f.f_lineno}"

    def stack(self, f: Optional[FrameType], limit: int = 4,
              depth: int = 24) -> Tuple[Tuple[str, int, str], ...]:
        """``(file, line, function)`` of ``f`` and the user frames that called it (at
        most ``limit`` of them, looking ``depth`` frames up, and none beyond the
        overlapcheck code that runs the program): cheap to take at every access;
        ``format`` turns it into text when a report needs it."""
        out = []
        while f is not None and len(out) < limit and depth > 0:
            code = f.f_code
            if code.co_filename.startswith(_CALLERS):
                break
            if self.is_user(code.co_filename):
                out.append((code.co_filename, f.f_lineno, code.co_name))
            f = f.f_back
            depth -= 1
        return tuple(out)

    def format(self, stack) -> Tuple[str, ...]:
        return tuple(f"{self.show(fn)}:{line} in {name}" for fn, line, name in stack)
