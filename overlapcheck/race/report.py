"""Access records and race reports.

A report names both conflicting accesses: context, operation, buffer, rows, the
owner of the memory at the time, and the user's stack frame that issued each one.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import FrozenSet, Optional

from .clocks import Clock, CtxId, Epoch

Rows = Optional[FrozenSet[int]]  # None: the whole buffer

# Report kinds.
STREAM_STREAM = "stream-stream"
HOST_READ_BEFORE_COPY = "host-read-before-copy"   # pinned D2H buffer read too early
HOST_WRITE_DURING_COPY = "host-write-during-copy"  # H2D staging buffer rewritten too early
HOST_STREAM = "host-stream"
REUSE = "reuse"                                   # new owner vs previous owner

# not a race: a launch's access outside its declaration, from an audited run
# (``device/audit.py``; the access-audit checker's, stream-race skips it)
UNDECLARED = "undeclared-access"
KINDS = (STREAM_STREAM, HOST_READ_BEFORE_COPY, HOST_WRITE_DURING_COPY, HOST_STREAM, REUSE)


@dataclass(frozen=True)
class OpInfo:
    """What issued an access: the operation's name, whether it is a copy, and the
    user's frame (``file:line``) that launched or called it."""

    name: str
    frame: str = "?"
    is_copy: bool = False


@dataclass(slots=True)
class Access:
    """One access as the detector records it. ``owner`` is filled in when a report
    names the access (the owner at the time the host issued it, ``Detector._report``)."""

    ctx: CtxId
    ctx_name: str
    epoch: Epoch
    clock: Clock          # the accessing point's clock (a snapshot, never mutated)
    write: bool
    rows: Rows
    owner: object
    op: OpInfo

    def describe(self) -> str:
        what = "write" if self.write else "read"
        copy = " (copy)" if self.op.is_copy else ""
        owner = f", owner {self.owner}" if self.owner is not None else ""
        return (f"{what} by {self.ctx_name} in '{self.op.name}'{copy} at {self.op.frame}"
                f"{owner}")


def rows_text(rows: Rows) -> str:
    if rows is None:
        return "all rows"
    s = sorted(rows)
    if len(s) > 8:
        return "rows {" + ",".join(map(str, s[:8])) + f",... ({len(s)} rows)}}"
    return "rows {" + ",".join(map(str, s)) + "}"


@dataclass
class RaceReport:
    """Two conflicting accesses to the same memory that happens-before does not order."""

    kind: str
    buffer: str
    rows: Rows            # rows both accesses touch
    current: Access
    previous: Access
    notes: tuple = field(default=())

    @property
    def site(self) -> tuple:
        """A stable identity for deduplication: kind, buffer, and both op names."""
        return (self.kind, self.buffer, self.previous.op.name, self.current.op.name)

    def __str__(self) -> str:
        lines = [
            f"race ({self.kind}) on '{self.buffer}' {rows_text(self.rows)}:",
            f"  now:  {self.current.describe()}",
            f"  prev: {self.previous.describe()}",
            f"  unordered: {self.current.ctx_name} has not synchronized with "
            f"{self.previous.ctx_name} since that access",
        ]
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)

    def to_json(self) -> dict:
        def acc(a: Access) -> dict:
            return {"context": a.ctx_name, "op": a.op.name, "frame": a.op.frame,
                    "write": a.write, "copy": a.op.is_copy,
                    "owner": None if a.owner is None else str(a.owner)}
        return {"kind": self.kind, "buffer": self.buffer,
                "rows": None if self.rows is None else sorted(self.rows),
                "current": acc(self.current), "previous": acc(self.previous)}
