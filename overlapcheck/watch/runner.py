"""Run an unmodified program under ``watch``: a script (as ``python script.py args``
would) or a module (``python -m module args``), in this process, with its own
``sys.argv``; ``sys.path`` and ``sys.argv`` are restored afterwards.

``parse_command`` turns the words after ``overlapcheck watch --`` into a target
without importing torch; ``run_program`` runs it and returns an ``Outcome``: the
program's own exit status, the uncaught exception if any, and the ``Watch`` with its
reports.
"""
from __future__ import annotations

import os
import re
import runpy
import sys
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from ..errors import UsageError

USAGE = ("overlapcheck watch [--device cpu|cuda|auto] [--mode log|raise] -- "
         "python script.py [args...]")
_PYTHON = re.compile(r"^python(\d+(\.\d+)*)?$")


@dataclass
class Outcome:
    status: int                      # what the program's exit status would be
    watch: object                    # the Watch, with its reports
    error: Optional[BaseException]   # the program's uncaught exception
    json_error: Optional[str] = None  # why the JSON report could not be written


def parse_command(words: Sequence[str]) -> Tuple[str, str, List[str]]:
    """``("script", path, args)`` or ``("module", name, args)`` from ``python
    script.py args`` / ``python -m module args`` (the interpreter word is optional)."""
    words = list(words)
    if words and words[0] == "--":
        words = words[1:]
    if words and (_PYTHON.match(os.path.basename(words[0]))
                  or os.path.abspath(words[0]) == os.path.abspath(sys.executable)):
        words = words[1:]
    if not words:
        raise UsageError(f"no program to run: {USAGE}")
    if words[0] == "-m":
        if len(words) < 2:
            raise UsageError(f"-m needs a module name: {USAGE}")
        return "module", words[1], words[2:]
    if words[0].startswith("-"):
        raise UsageError(f"only `python script.py` or `python -m module` can run under "
                         f"watch, not {words[0]!r}")
    path = words[0]
    if not os.path.isfile(path):
        import shutil
        if os.sep not in path and shutil.which(path):
            raise UsageError(f"{path!r} is a program, not a Python script: watch runs Python "
                             f"code in its own process ({USAGE})")
        raise UsageError(f"no such script: {path}")
    if not _python_source(path):
        raise UsageError(f"{path} is not a Python script: watch runs Python code in its own "
                         f"process ({USAGE})")
    return "script", path, words[1:]


def _python_source(path: str) -> bool:
    """Does ``path`` look like Python source: a ``.py`` file, or text whose first line is
    not another interpreter's ``#!``? (A binary or a shell script would fail to compile
    with a traceback of runpy's.)"""
    if path.endswith((".py", ".pyw")):
        return True
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    if b"\0" in head:
        return False
    first = head.split(b"\n", 1)[0]
    return not first.startswith(b"#!") or b"python" in first


def exit_status(code) -> int:
    """The status ``sys.exit(code)`` gives the process."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def run_program(target: str, args: Sequence[str] = (), *, module: bool = False,
                device: str = "auto", mode: str = "log",
                json_path: Optional[str] = None) -> Outcome:
    """Run a script (or, with ``module``, a module) as ``__main__`` under ``watch``."""
    from .session import Watch, resolve_device

    # the report is written here, after the program: a path that cannot be written
    # leaves the program's own outcome as it was
    w = Watch(resolve_device(device), mode)
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    status, error, json_error = 0, None, None
    try:
        if module:
            sys.argv = [target, *args]
            sys.path.insert(0, os.getcwd())
        else:
            sys.argv = [target, *args]
            sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
        with w:
            if module:
                runpy.run_module(target, run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(target, run_name="__main__")
    except SystemExit as e:
        status = exit_status(e.code)
    except KeyboardInterrupt as e:   # as Python ends on one: its traceback, status 130
        status, error = 130, e
    except Exception as e:  # the program's own failure: kept, reported by the caller
        status, error = 1, e
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path
    if json_path:
        try:
            w.write_json(json_path)
        except OSError as e:
            json_error = e.strerror or type(e).__name__
    return Outcome(status, w, error, json_error)
