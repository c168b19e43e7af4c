"""host-race: with the forward thread, two accesses from different host threads to the
same field of a shared host object, at least one a write, are ordered by a queue
handoff (docs/design.md §4.14, §5.2).

Happens-before between the two host threads comes only from their queues: a put
publishes everything its thread did before it, the get of the same item acquires it.
Each thread keeps a vector clock (two entries); a put stamps its item with the putter's
clock and then advances the putter's own entry, a get joins the item's stamp. An
access is ordered after an earlier one of the other thread exactly when the reader's
clock has reached the earlier access's stamp. The engine declares the accesses
(``HostAccess``: the shared fields of requests its worker reads and its scheduler
thread writes, the batch objects handed over) and the handoffs (``HostQueue``).
"""
from __future__ import annotations

from typing import Dict, List, Tuple

from overlapcheck.protocol import events as E
from overlapcheck.race.clocks import join_into

from .base import Checker, Violation

_INDEX = {"scheduler": 0, "forward": 1}


class HostRace(Checker):
    name = "host-race"
    targets = ("reference",)    # reads what only the reference engine emits

    def __init__(self, **context) -> None:
        super().__init__(**context)
        self.clocks: List[List[int]] = [[1, 0], [0, 1]]
        self.items: Dict[Tuple[str, int], List[int]] = {}   # (queue, seq) -> put's stamp
        # (object, field) -> the last write: (thread, its epoch, step, batch)
        self.writes: Dict[tuple, tuple] = {}
        # (object, field) -> reads since that write, one per thread: (thread, epoch, ...)
        self.reads: Dict[tuple, Dict[int, tuple]] = {}

    def on_HostQueue(self, ev: E.HostQueue):
        t = _INDEX[ev.thread]
        clock = self.clocks[t]
        if ev.op == "put":
            self.items[(ev.queue, ev.seq)] = list(clock)
            clock[t] += 1
        else:
            join_into(clock, self.items.pop((ev.queue, ev.seq)))
        return []

    def on_HostAccess(self, ev: E.HostAccess) -> List[Violation]:
        t = _INDEX[ev.thread]
        clock = self.clocks[t]
        key = (ev.obj, ev.field)
        here = (t, clock[t], ev.iteration, ev.batch, ev.write)
        out = []
        w = self.writes.get(key)
        if w is not None and w[0] != t and w[1] > clock[w[0]]:
            out.append(self._race(ev, w, here))
        reads = self.reads.get(key)
        if ev.write:
            for r in (reads or {}).values():
                if r[0] != t and r[1] > clock[r[0]]:
                    out.append(self._race(ev, r, here))
            self.writes[key] = here
            self.reads.pop(key, None)
        else:
            if reads is None:
                reads = self.reads[key] = {}
            reads[t] = here
        if ev.obj[0] == "batch" and ev.field == "launch" and not ev.write:
            # the scheduler thread took the batch back: its last access
            for f in ("entries", "inputs", "launch"):
                self.writes.pop((ev.obj, f), None)
                self.reads.pop((ev.obj, f), None)
        return out

    def _race(self, ev: E.HostAccess, prev: tuple, here: tuple) -> Violation:
        kind, oid = ev.obj

        def said(a: tuple) -> str:
            return (f"the {_name(a[0])} thread's {'write' if a[4] else 'read'} at step {a[2]} "
                    f"(batch {a[3]})")

        return Violation(
            self.name, ev.iteration,
            f"host threads race on {kind} {oid}'s {ev.field}: {said(prev)} and {said(here)} "
            f"are not ordered by a queue handoff",
            f"{said(prev)} happens before the other thread's access through a put and its get",
            f"{said(here)} is unordered with it",
            (kind, ev.field), details={"object": ev.obj, "field": ev.field})


def _name(t: int) -> str:
    return "scheduler" if t == 0 else "forward"
