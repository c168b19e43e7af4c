"""The repro file: schema-versioned YAML, written atomically, loaded safely.

A repro holds everything needed to reproduce one finding from the file alone: the
case (target, config, workload, schedule, checkers, faults), the recorded schedule
choices, the finding, the trace digest of the run, the target's engine version, and
the overlapcheck version and commit that wrote it. Schema 2 added the target; a
schema-1 file (the reference engine, with a ``seed`` field no run read) still loads. Files are read with ``yaml.safe_load`` only (no tags construct
objects) and validated; anything else is a ``ReproError`` with a one-line message.
"""
from __future__ import annotations

import functools
import os
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from typing import List, Optional

import yaml

from .. import __version__
from ..device import DEVICES
from ..protocol.finding import ENGINE_EXCEPTION, Finding
from ..run.case import SCHEMA, Case, CaseError

SCHEMAS = (1, SCHEMA)    # the schemas this overlapcheck reads
FINDING_KINDS = (ENGINE_EXCEPTION,)   # findings no registered checker makes
MAX_BYTES = 16 << 20
_TOP = {"schema", "overlapcheck", "commit", "device", "case", "choices", "finding", "digest",
        "steps", "requests", "note", "engine_version"}


class ReproError(ValueError):
    """A repro file that cannot be read or does not fit the schema; one line."""


@dataclass
class Repro:
    case: Case
    choices: Optional[List[int]]
    finding: Finding
    digest: str
    device: str = "sim"
    steps: int = 0
    commit: str = ""
    version: str = __version__
    note: str = ""
    engine_version: str = ""    # the target engine's version (vLLM's, SGLang's, ours)

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, "overlapcheck": self.version, "commit": self.commit,
                "engine_version": self.engine_version,
                "device": self.device, "note": self.note, "finding": self.finding.to_dict(),
                "digest": self.digest, "steps": self.steps,
                "requests": len(self.case.workload.requests),
                "case": self.case.to_dict(), "choices": self.choices}


@functools.lru_cache(maxsize=None)
def current_commit() -> str:
    """The git commit of this checkout (asked once per process: a campaign writes a repro
    each time shrinking finds a smaller case)."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=here,
                             capture_output=True, text=True, timeout=5)
        return out.stdout.strip() if out.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def dumps(r: Repro) -> str:
    """The YAML text of ``r``, by libyaml's safe emitter where PyYAML has it (about
    three times as fast as the pure-Python one: a campaign writes a repro as soon as it
    sees a finding, and again as it shrinks)."""
    return yaml.dump(r.to_dict(), Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper),
                     sort_keys=False, default_flow_style=None, width=100)


def _temp_prefix() -> str:
    """The name a writer's temporary files start with: its host and process, so that a
    later writer can tell the part file of a killed one (``kill -9`` mid-write) from one
    a live campaign sharing the folder is still writing (``sweep_stale``)."""
    host = "".join(c if c.isalnum() else "_" for c in socket.gethostname())[:40]
    return f".tmp-{host}-{os.getpid()}-"


def _mkstemp(folder: str):
    return tempfile.mkstemp(prefix=_temp_prefix(), suffix=".part", dir=folder)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:          # another user's process: alive
        return True
    return True


def sweep_stale(folder: str) -> List[str]:
    """Remove the temporary files in ``folder`` that writers on this host left when they
    were killed mid-write (their process is gone), and return their names. A part file
    of a live process, or of another host sharing the folder, is left alone."""
    host = _temp_prefix().split("-")[1]
    gone = []
    try:
        names = os.listdir(folder)
    except OSError:
        return gone
    for name in names:
        parts = name.split("-")
        if (not name.startswith(".tmp-") or not name.endswith(".part") or len(parts) < 4
                or parts[1] != host or not parts[2].isdigit() or _alive(int(parts[2]))):
            continue
        try:
            os.unlink(os.path.join(folder, name))
            gone.append(name)
        except OSError:
            pass
    return gone


def write_atomic(path: str, text: str) -> None:
    """Write ``text`` to ``path`` so that a reader (or a crash) sees either the old
    file or the whole new one: a temporary file in the same folder, fsync, rename."""
    folder = os.path.dirname(os.path.abspath(path)) or "."
    os.makedirs(folder, exist_ok=True)
    fd, tmp = _mkstemp(folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:
        dfd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


def save(r: Repro, path: str) -> None:
    write_atomic(path, dumps(r))


def write_new(folder: str, stem: str, suffix: str, text: str) -> str:
    """Write ``text`` under a name of its own in ``folder`` and return its path:
    ``<stem><suffix>``, or ``<stem>-2<suffix>``, ``-3``... where that name is taken.
    The name is claimed and the whole text put there in one step (a hard link of a
    written temporary file, which fails where the name exists), so two writers sharing
    the folder (two campaigns with one ``--out``) never replace each other's file, and a
    reader never sees a part of one. Later versions of the file replace it in place
    (``write_atomic``)."""
    os.makedirs(folder, exist_ok=True)
    fd, tmp = _mkstemp(folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        for n in range(1, 10000):
            path = os.path.join(folder, f"{stem}{suffix}" if n == 1 else f"{stem}-{n}{suffix}")
            try:
                os.link(tmp, path)
                return path
            except FileExistsError:
                continue
            except OSError:     # a file system without hard links: claim by O_EXCL, then fill
                try:
                    os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
                except FileExistsError:
                    continue
                os.replace(tmp, path)
                return path
        raise FileExistsError(f"{folder}: no free name for {stem}{suffix}")
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise ReproError(msg)


def parse(doc) -> Repro:
    _need(isinstance(doc, dict), f"not a repro: expected a mapping at the top, got {type(doc).__name__}")
    unknown = sorted(set(map(str, doc)) - _TOP)
    _need(not unknown, f"unknown field {unknown[0]!r}" if unknown else "")
    schema = doc.get("schema")
    _need(schema in SCHEMAS and not isinstance(schema, bool),
          f"unsupported schema {schema!r} (this overlapcheck reads schemas "
          f"{', '.join(map(str, SCHEMAS))})")
    for key in ("case", "finding"):
        _need(key in doc, f"missing field {key!r}")
    try:
        case = Case.from_dict(doc["case"], schema)
    except CaseError as e:
        raise ReproError(str(e)) from None
    except (TypeError, ValueError, AttributeError, KeyError) as e:
        raise ReproError(f"case: malformed ({type(e).__name__}: {e})".splitlines()[0]) from None
    choices = doc.get("choices")
    _need(choices is None or (isinstance(choices, list) and all(
        isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in choices)),
        "choices: expected a list of non-negative integers")
    f = doc["finding"]
    _need(isinstance(f, dict) and isinstance(f.get("checker"), str)
          and isinstance(f.get("site"), list) and isinstance(f.get("step", 0), int)
          and isinstance(f.get("text", ""), str)
          and isinstance(f.get("data", {}) or {}, dict),
          "finding: expected checker (text), site (list), step (integer), text")
    _need(f["checker"] in FINDING_KINDS or f["checker"] in _checkers(),
          f"finding.checker: unknown checker {f['checker']!r} (a replay could never show it)")
    finding = Finding(f["checker"], tuple(map(str, f["site"])), int(f.get("step", 0)),
                      f.get("text", ""), dict(f.get("data") or {}))
    device = doc.get("device", "sim")
    _need(device in DEVICES, f"device: must be one of {', '.join(DEVICES)}, got {device!r}")
    for key in ("digest", "commit", "overlapcheck", "note", "engine_version"):
        _need(isinstance(doc.get(key, ""), str), f"{key}: expected text")
    _need(isinstance(doc.get("steps", 0), int), "steps: expected an integer")
    return Repro(case, choices, finding, doc.get("digest", ""), device,
                 doc.get("steps", 0), doc.get("commit", ""), doc.get("overlapcheck", ""),
                 doc.get("note", ""), doc.get("engine_version", ""))


def _checkers():
    from invariants.base import REGISTRY
    return REGISTRY


def loads(text: str) -> Repro:
    from .. import plainyaml
    try:
        doc = plainyaml.load(text)     # yaml.safe_load's result, faster on long choices
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise ReproError(f"not valid YAML{at}: {getattr(e, 'problem', None) or type(e).__name__}") from None
    except (ValueError, TypeError, RecursionError) as e:  # odd scalars, deep nesting
        raise ReproError(f"not valid YAML: {type(e).__name__}") from None
    return parse(doc)


def load(path: str) -> Repro:
    try:
        _need(not os.path.exists(path) or os.path.isfile(path), f"{path}: not a regular file")
        size = os.path.getsize(path)
        _need(size <= MAX_BYTES, f"{path}: {size} bytes is larger than a repro may be")
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise ReproError(f"cannot read {path}: {e.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ReproError(f"{path}: not UTF-8 text") from None
    try:
        return loads(text)
    except ReproError as e:
        raise ReproError(f"{path}: {e}") from None
