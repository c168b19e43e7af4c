"""stream-race: no two conflicting accesses unordered by happens-before —
stream<->stream, host<->stream (pinned buffers read before their copy landed, staging
buffers rewritten during a copy) and recycled torch storage.

A pure consumer of the engine's ``RaceFound`` events (the runtime detector's reports);
reuse of request-owned memory is kv-lifetime's, a launch's access outside its
declaration access-audit's.
"""
from __future__ import annotations

from typing import List

from overlapcheck.protocol import events as E
from overlapcheck.race.report import rows_text

from .access_audit import is_audit
from .base import Checker, Violation
from .kv_lifetime import facts, is_request_reuse


class StreamRace(Checker):
    name = "stream-race"
    # the reference engine's runtime detector, and SGLang's real workers and vLLM's
    # real model runner under watch
    targets = ("reference", "sglang", "vllm")

    def on_RaceFound(self, ev: E.RaceFound) -> List[Violation]:
        rep = ev.report
        if hasattr(rep, "missing_edge"):
            return self._watched(ev, rep)
        if is_request_reuse(rep) or is_audit(rep):
            return []
        expected, seen = facts(rep)
        msg = (f"{rep.kind} race on '{rep.buffer}' {rows_text(rep.rows)}: "
               f"'{rep.current.op.name}' on {rep.current.ctx_name} vs "
               f"'{rep.previous.op.name}' on {rep.previous.ctx_name}")
        return [Violation(self.name, ev.iteration, msg, expected, seen, rep.site,
                          {"report": rep.to_json(), "batch": ev.batch})]

    def _watched(self, ev: E.RaceFound, rep) -> List[Violation]:
        """A race ``watch`` found in an engine's own code (``WatchReport``): both
        accesses at the engine's lines, and the edge that would order them."""
        cur, prev = rep.current, rep.previous
        verb = {True: "write", False: "read"}
        msg = (f"{rep.kind} race on {rep.memory} ({rep.rows}): '{cur['op']}' on "
               f"{cur['context']} at {cur['frame']} vs '{prev['op']}' on "
               f"{prev['context']} at {prev['frame']}")
        expected = (f"the {verb[bool(prev['write'])]} by {prev['context']} in '{prev['op']}' "
                    f"at {prev['frame']} happens before the conflicting access "
                    f"({rep.missing_edge})")
        seen = (f"the {verb[bool(cur['write'])]} by {cur['context']} in '{cur['op']}' at "
                f"{cur['frame']} is unordered with it")
        return [Violation(self.name, ev.iteration, msg, expected, seen, rep.key,
                          {"report": rep.to_json(), "batch": ev.batch})]
