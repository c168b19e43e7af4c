"""Run logs: the engine's event stream as schema-versioned JSON lines.

Line 1 is the header ``{"schema": "overlapcheck.runlog", "version": 1, "run": {...}}``;
then one record per line: ``{"t": "<EventClass>", ...fields}`` for events,
``{"t": "violation", ...}`` for checker violations, and ``{"t": "end", "status": ...,
"steps": N}`` last. Every line is flushed as it is written, so a killed run leaves a
readable prefix (``read_log(..., partial=True)`` takes one). Snapshots store their
ledger grouped by owner (``ledger_groups``: [request, purpose, step, [slots]]); race
reports and run results are stored as plain JSON and read back as dicts.

Reading validates everything: bad input raises ``LogError`` with a one-line message.
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from typing import IO, List, Optional, Union

from overlapcheck.protocol import events as E
from overlapcheck.protocol.types import RequestSpec

SCHEMA, VERSION = "overlapcheck.runlog", 1
_NESTED = {"Snapshot": E.Snapshot, "ReqState": E.ReqState, "RequestSpec": RequestSpec}
_EVENTS = {name: cls for name, cls in vars(E).items()
           if isinstance(cls, type) and issubclass(cls, E.Event) and cls is not E.Event}


class LogError(ValueError):
    """A run log that cannot be read; one line."""


def _enc(v):
    if isinstance(v, E.LazyTuple):
        v = v.get()
    if isinstance(v, E.Snapshot):
        d = {f.name: _enc(getattr(v, f.name)) for f in dataclasses.fields(v) if f.name != "ledger"}
        groups = {}
        for s, rid, purpose, step in v.ledger:
            groups.setdefault((rid, purpose, step), []).append(s)
        d["ledger_groups"] = [[rid, p, st, sl] for (rid, p, st), sl in groups.items()]
        return {"_t": "Snapshot", **d}
    if hasattr(v, "to_json"):
        return {"_t": type(v).__name__, **v.to_json()}
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {"_t": type(v).__name__,
                **{f.name: _enc(getattr(v, f.name)) for f in dataclasses.fields(v)}}
    if isinstance(v, (list, tuple, frozenset, set)):
        return [_enc(x) for x in (sorted(v) if isinstance(v, (set, frozenset)) else v)]
    if isinstance(v, dict):
        return {str(k): _enc(x) for k, x in v.items()}
    return v


def _dec(v):
    if isinstance(v, list):
        return tuple(_dec(x) for x in v)
    if isinstance(v, dict):
        t = v.get("_t")
        fields = {k: _dec(x) for k, x in v.items() if k != "_t"}
        if t == "Snapshot":
            groups = fields.pop("ledger_groups", ())
            fields["ledger"] = tuple(sorted((s, rid, p, st) for rid, p, st, sl in groups for s in sl))
        cls = _NESTED.get(t)
        return cls(**fields) if cls is not None else v
    return v


class RunLog:
    """Writes a run log; use as the ``log`` of ``drive.Monitor``."""

    def __init__(self, dest: Union[str, IO[str]], run: Optional[dict] = None):
        self.f = open(dest, "w", encoding="utf-8") if isinstance(dest, str) else dest
        self._own = isinstance(dest, str)
        self._line({"schema": SCHEMA, "version": VERSION, "run": _enc(run or {})})

    def _line(self, rec: dict) -> None:
        self.f.write(json.dumps(rec, separators=(",", ":")) + "\n")
        self.f.flush()

    def event(self, ev: E.Event) -> None:
        self._line({"t": type(ev).__name__,
                    **{f.name: _enc(getattr(ev, f.name)) for f in dataclasses.fields(ev)}})

    def violation(self, v) -> None:
        self._line({"t": "violation", **v.to_json()})

    def end(self, status: str, steps: int) -> None:
        self._line({"t": "end", "status": status, "steps": steps})
        if self._own:
            self.f.close()


@dataclass
class Log:
    run: dict
    events: List[E.Event]
    violations: List[dict]
    end: Optional[dict]          # None: the log stops early (a killed run)


def read_log(path: str, partial: bool = False) -> Log:
    """Read and validate a run log. Without ``partial``, a log that lacks its end
    record is refused as truncated."""
    if os.path.exists(path) and not os.path.isfile(path):    # a folder, a pipe: never read
        raise LogError(f"cannot read {path}: not a regular file")
    try:
        with open(path, "r", encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise LogError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    if not text.strip():
        raise LogError(f"{path} is empty")
    lines = text.split("\n")
    cut = not text.endswith("\n")
    recs = []
    for i, line in enumerate(lines[:-1] if not cut else lines, 1):
        try:
            rec = json.loads(line)
        except ValueError:
            last = i == len(lines) - (0 if cut else 1)
            raise LogError(f"{path}: line {i} is not JSON" + (" (truncated)" if last else "")) from None
        if not isinstance(rec, dict):
            raise LogError(f"{path}: line {i} is not a record")
        recs.append(rec)
    head = recs[0]
    if head.get("schema") != SCHEMA:
        raise LogError(f"{path} is not an overlapcheck run log (no '{SCHEMA}' header)")
    if head.get("version") != VERSION:
        raise LogError(f"{path}: run log version {head.get('version')!r} (this reads {VERSION})")
    events, violations, end = [], [], None
    for i, rec in enumerate(recs[1:], 2):
        t = rec.get("t")
        if end is not None:
            raise LogError(f"{path}: line {i} follows the end record")
        if t == "end":
            end = rec
        elif t == "violation":
            violations.append(rec)
        elif t in _EVENTS:
            try:
                events.append(_EVENTS[t](**{k: _dec(v) for k, v in rec.items() if k != "t"}))
            except (TypeError, ValueError, AttributeError) as e:
                raise LogError(f"{path}: line {i}: bad {t} record ({e})") from None
        else:
            raise LogError(f"{path}: line {i}: unknown record type {t!r}")
    if end is None and not partial:
        step = events[-1].iteration if events else 0
        raise LogError(f"{path} ends at step {step} without its end record "
                       f"(truncated; --partial reads the prefix)")
    return Log(head.get("run") or {}, events, violations, end)
