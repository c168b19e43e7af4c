"""kv-lifetime: at a KV slot's or request-pool row's change of owner, the new owner's
first accesses are ordered after the previous owner's last ones (docs/design.md §3.6, memory
reuse).

The runtime's happens-before detector judges every access against the previous
owner's; the engine delivers its reports as ``RaceFound`` events. This checker takes
the *reuse* reports on memory the engine hands from request to request (owners are
request ids); every other report belongs to stream-race.
"""
from __future__ import annotations

from typing import List

from overlapcheck.protocol import events as E
from overlapcheck.race.report import REUSE, rows_text

from .base import Checker, Violation


def is_request_reuse(report) -> bool:
    """A reuse report on memory owned by requests (KV slots, table/FutureMap rows), as
    opposed to a torch storage recycled by the caching allocator (owner ``name#serial``)."""
    return (report.kind == REUSE and not isinstance(report.current.owner, str)
            and not isinstance(report.previous.owner, str))


def facts(report) -> tuple:
    """(expected, seen) texts of a race report: both conflicting accesses."""
    return (f"{report.previous.describe()} happens before the conflicting access",
            f"{report.current.describe()} is unordered with it")


class KVLifetime(Checker):
    name = "kv-lifetime"
    targets = ("reference",)    # reads what only the reference engine emits

    def on_RaceFound(self, ev: E.RaceFound) -> List[Violation]:
        rep = ev.report
        if not is_request_reuse(rep):
            return []
        expected, seen = facts(rep)
        what = "slots" if "kv" in rep.buffer else "rows"
        msg = (f"'{rep.buffer}' {rows_text(rep.rows).replace('rows', what, 1)} passed from "
               f"request {rep.previous.owner} to request {rep.current.owner} while "
               f"'{rep.previous.op.name}' ({rep.previous.ctx_name}) may still touch them")
        return [Violation(self.name, ev.iteration, msg, expected, seen, rep.site,
                          {"buffer": rep.buffer, "rows": rep.rows, "previous_owner": rep.previous.owner,
                           "new_owner": rep.current.owner, "batch": ev.batch})]
