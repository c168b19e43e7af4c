"""access-audit: every access a kernel made lies inside its launch's declaration.

In the declared mode the race detector sees a launch only through its declaration, so a
declaration narrower than the kernel (a batch's KV slots cut short, a buffer left out)
hides every race on what it leaves out. An audited run (``access="audit"``: the fuzzer
audits a share of its examples, ``Case.audit``) also infers each declared launch's
accesses and reports what the declaration does not hold (``device/audit.py``); the
reports come as ``RaceFound`` events, and this checker takes them (stream-race leaves
them alone).
"""
from __future__ import annotations

from typing import List

from overlapcheck.protocol import events as E
from overlapcheck.race.report import UNDECLARED, rows_text

from .base import Checker, Violation


def is_audit(report) -> bool:
    """An access-audit report, not a race."""
    return getattr(report, "kind", None) == UNDECLARED


class AccessAudit(Checker):
    name = "access-audit"
    targets = ("reference",)    # the reference engine's runtime audits its launches

    def on_RaceFound(self, ev: E.RaceFound) -> List[Violation]:
        rep = ev.report
        if not is_audit(rep):
            return []
        what = "wrote" if rep.write else "read"
        msg = (f"launch '{rep.op}' on {rep.context} {what} '{rep.buffer}' "
               f"{rows_text(rep.rows)} outside its declared accesses")
        return [Violation(self.name, ev.iteration, msg,
                          f"every {'write' if rep.write else 'read'} of '{rep.op}' inside its "
                          f"declaration ({rep.describe_declared()})",
                          f"'{rep.op}' at {rep.frame} {what} '{rep.buffer}' {rows_text(rep.rows)}",
                          rep.site, {"report": rep.to_json(), "batch": ev.batch})]
