"""The access audit: a launch's declaration held against what its kernel touched.

With ``access="declared"`` a launch that declares its accesses runs uninterrupted, and
the detector takes the declaration as it is: a declaration narrower than the kernel
(a batch's KV slots cut short, a buffer left out) blinds every race checker to the
accesses it leaves out. ``access="audit"`` runs each declared launch under the access
inference mode as well (docs/design.md §3.4) and, where the kernel touched rows or
buffers its declaration does not hold, records an ``AuditReport`` instead of raising:
the detector is still fed the declaration, so the race checkers' verdicts are the
declared mode's, and the report says what they could not see. The reports go with the
detector's (``RaceFound`` events); the ``access-audit`` checker reads them.

The fuzzer audits a share of its examples (``Case.audit``); ``run --access audit``
audits a run.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import FrozenSet, List, Optional

from ..race.report import UNDECLARED, rows_text


@dataclass(frozen=True)
class AuditReport:
    """Launch ``op`` (on ``context``, issued at ``frame``) read or wrote ``rows`` of
    ``buffer`` (None: all of it) outside its declaration; ``declared``: the rows it
    declared for that access (None: none at all, the buffer is missing)."""

    op: str
    frame: str
    context: str
    buffer: str
    write: bool
    rows: Optional[FrozenSet[int]]
    declared: Optional[FrozenSet[int]]
    kind: str = UNDECLARED

    @property
    def site(self) -> tuple:
        """Deduplication: the buffer. The launches that touch a buffer mostly share the
        rows they declare (a batch's KV slots, its table rows), so one narrowing shows in
        all of them at once: one finding (naming the first launch), not one per launch."""
        return (self.kind, self.buffer)

    def describe_declared(self) -> str:
        if self.declared is None:
            return f"'{self.buffer}' not declared"
        return f"'{self.buffer}' declared {rows_text(self.declared)}"

    def __str__(self) -> str:
        what = "wrote" if self.write else "read"
        return (f"undeclared access: launch '{self.op}' on {self.context} at {self.frame} "
                f"{what} '{self.buffer}' {rows_text(self.rows)} outside its declaration "
                f"({self.describe_declared()})")

    def to_json(self) -> dict:
        return {"kind": self.kind, "op": self.op, "frame": self.frame,
                "context": self.context, "buffer": self.buffer, "write": self.write,
                "rows": None if self.rows is None else sorted(self.rows),
                "declared": None if self.declared is None else sorted(self.declared)}


def undeclared(acc, declared: dict, op, context: str) -> List[AuditReport]:
    """What ``acc`` (an ``infer.AccessSet``) touched outside ``declared`` (the runtime's
    declaration table: memory id -> [buffer, rows read, rows written]), one report per
    buffer and kind of access; the same rule as the ``infer`` mode's check (a declared
    write allows reading those rows too), reported instead of raised."""
    out: List[AuditReport] = []
    for mem, (buf, r, w) in acc.exact.items():
        read, written = acc.touched[mem]
        ent = declared.get(mem)
        if ent is None:
            dr = dw = frozenset()
        else:
            dr, dw = ent[1], ent[2]
        allowed_r = None if (dr is None or dw is None) else (dr | dw)
        for write, touched, used, allowed in ((True, written, w, dw), (False, read, r, allowed_r)):
            if not touched or allowed is None:
                continue
            if used is None or not allowed:
                # all rows, and the declaration holds fewer; or none of this kind declared
                # (rows an index op touched on a device whose indices the host cannot see:
                # empty, shown as all rows)
                extra = used or None
            else:
                extra = frozenset(used - allowed)
                if not extra:
                    continue
            out.append(AuditReport(op.name, op.frame, context, buf.name, write, extra,
                                   None if ent is None else allowed))
    return out
