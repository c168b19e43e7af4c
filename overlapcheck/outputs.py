"""Where commands write: output files and folders checked before any work starts, so
that a path that cannot be written is one line and exit 2 (``UsageError``) instead of
a traceback after a run, or a campaign whose findings are lost.

A check writes nothing the user would not have got anyway: a folder that will be
written is created, and a probe file in it is made and removed at once.
"""
from __future__ import annotations

import os
import stat
import tempfile

from .errors import UsageError


def _why(e: OSError) -> str:
    return e.strerror or type(e).__name__


def output_folder(path: str, flag: str) -> str:
    """``path`` as a folder this process can write files into, created if missing;
    ``UsageError`` naming ``flag`` otherwise."""
    if not path:
        raise UsageError(f"{flag}: empty path")
    if os.path.exists(path) and not os.path.isdir(path):
        raise UsageError(f"{flag} {path}: not a folder")
    try:
        os.makedirs(path, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".probe-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise UsageError(f"{flag} {path}: cannot write there ({_why(e)})") from None
    return path


def output_file(path: str, flag: str) -> str:
    """``path`` as a file this process can create or replace: not a folder, in a folder
    that exists (or can be made) and can be written; ``UsageError`` naming ``flag``
    otherwise."""
    if not path:
        raise UsageError(f"{flag}: empty path")
    if os.path.isdir(path) or path.endswith(os.sep):
        raise UsageError(f"{flag} {path}: a folder, not a file")
    try:
        mode = os.stat(path).st_mode
    except OSError:
        mode = 0
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):    # writing would wait for a reader
        raise UsageError(f"{flag} {path}: a pipe or socket, not a file")
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise UsageError(f"{flag} {path}: cannot write there (permission denied)")
    output_folder(os.path.dirname(os.path.abspath(path)), flag)
    return path
