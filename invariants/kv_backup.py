"""kv-backup: with the KV backup on, the host pool holds, at every backed-up position,
the target KV it copied (docs/design.md §5.2, §4.7).

The backup stream copies each decode's accepted positions into the host pool and
records, per request-pool row, the span of positions it has copied since the row's
owner was (re)prefilled. The next forward of that request (which waits for the pending
backup) compares, on the device, every host-pool row of that span with the target KV
of the same position, and the result travels in the KV canary record with the batch's
result — no extra sync (``Canary.backup``: span start and end, mismatching positions,
the first one and the (token, position, request) the host pool held there). So:

* every position of the span holds the target KV it copied (a backup of the wrong
  positions, of too few of them, or of KV not yet written, shows);
* the span reaches the committed length the forward read: every accepted decode
  position has been backed up.

Only models whose KV rows carry tags have the canary record (the oracle family), and
only configs with ``backup_canary`` (the default) keep the spans: elsewhere this checker
sees nothing. Context: ``kv_tags`` False (the model's KV has no tags) makes it idle.
"""
from __future__ import annotations

from typing import List, Optional, Set, Tuple

from overlapcheck.protocol import events as E

from .base import Checker, Violation


class KVBackup(Checker):
    name = "kv-backup"
    targets = ("reference",)

    def __init__(self, kv_tags: Optional[bool] = None, **context) -> None:
        super().__init__()
        self.idle = kv_tags is False    # no canary record, no backup check (kv-canary's)
        self.reported: Set[int] = set()

    def on_VerifiedBatch(self, ev: E.VerifiedBatch) -> List[Tuple[int, Violation]]:
        """``on_Canary`` over the run's records (none without the KV backup)."""
        out: List[Tuple[int, Violation]] = []
        if ev.backup and ev.records:
            for i in range(len(ev.rids)):
                out += [(ev.position(i, canary=True), v) for v in self.on_Canary(ev.canary(i))]
        return out

    def on_Canary(self, ev: E.Canary) -> List[Violation]:
        if len(ev.backup) < 7 or ev.rid in self.reported:
            return []
        start, end, bad, pos, tok, kpos, krid = ev.backup[:7]
        if not 0 <= start <= end or not 0 <= bad <= end - start:
            return []    # not a record a forward wrote: kv-canary reports the early read
        where = f"request {ev.rid} (forward of batch {ev.batch})"
        if bad:
            self.reported.add(ev.rid)
            return [Violation(
                self.name, ev.iteration, f"{where}: {bad} backed-up position(s) of "
                f"{start}..{end - 1} differ from the target KV; first at position {pos}",
                f"the host pool at position {pos} holds the target KV it copied "
                f"(request {ev.rid}, position {pos})",
                f"host pool holds (request {krid}, position {kpos}, token {tok})" if kpos >= 0
                else f"host pool holds a row never written (tag {kpos})", ("content",),
                {"rid": ev.rid, "batch": ev.batch, "position": pos, "span": (start, end)})]
        if end != ev.read_len:
            self.reported.add(ev.rid)
            return [Violation(
                self.name, ev.iteration, f"{where}: the backup covers positions "
                f"{start}..{end - 1}, not up to the committed length {ev.read_len}",
                f"backed up through position {ev.read_len - 1} (committed {ev.read_len})",
                f"backed up through position {end - 1}", ("gap",),
                {"rid": ev.rid, "batch": ev.batch, "span": (start, end),
                 "committed": ev.read_len})]
        return []
