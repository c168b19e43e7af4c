"""stream-race: no two conflicting accesses unordered by happens-before —
stream<->stream, host<->stream (pinned buffers read before their copy landed, staging
buffers rewritten during a copy) and recycled torch storage.

A pure consumer of the engine's ``RaceFound`` events (the runtime detector's reports);
reuse of request-owned memory is kv-lifetime's.
"""
from __future__ import annotations

from typing import List

from overlapcheck.protocol import events as E
from overlapcheck.race.report import rows_text

from .base import Checker, Violation
from .kv_lifetime import facts, is_request_reuse


class StreamRace(Checker):
    name = "stream-race"
    targets = ("reference",)    # reads what only the reference engine emits

    def on_RaceFound(self, ev: E.RaceFound) -> List[Violation]:
        rep = ev.report
        if is_request_reuse(rep):
            return []
        expected, seen = facts(rep)
        msg = (f"{rep.kind} race on '{rep.buffer}' {rows_text(rep.rows)}: "
               f"'{rep.current.op.name}' on {rep.current.ctx_name} vs "
               f"'{rep.previous.op.name}' on {rep.previous.ctx_name}")
        return [Violation(self.name, ev.iteration, msg, expected, seen, rep.site,
                          {"report": rep.to_json(), "batch": ev.batch})]
