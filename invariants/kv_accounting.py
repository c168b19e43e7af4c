"""kv-accounting: every KV slot and request-pool row is accounted for at every step.

The checker keeps its own ledger from the memory events (``Allocated``, ``Freed``,
``PendingReleased``, ``RowAssigned``, ``RowReleased``) and holds it against each step's
snapshot. It asserts: free + owned + pending-free == total; no slot allocated twice, freed
twice or freed by a non-owner; pending-free slots return only once the batch that may
read them is processed, and do return then; committed <= allocated <= row width; the
engine's ledger agrees with the events. A *leak* is a slot still owned by a request
that finished, aborted or was retracted, or a pending-free slot whose batch was
processed: it is certain at that step and named by request, purpose, allocating step
and slots/pages (``Violation.details`` holds them for ``overlapcheck leak-report``).

With the radix prefix cache (docs/design.md §4.13) ownership is shared: a slot may be
*cached* (``Cached``: the tree took it from a finished request; ``Evicted``: it left,
pending-free or free), and a cached slot is read by every request that locked it
(``PrefixLocked`` / ``PrefixReleased``). Then free + owned + pending + cached == total;
only unlocked slots are evicted; the engine's lock count of each cached slot equals the
locks the events say live requests hold. Cached slots are not a leak; a lock still held
when its request finished, aborted or was retracted is (purpose ``prefix-lock``), and so
is any cached slot still locked at idle.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Dict, List, Set, Tuple

from overlapcheck.protocol import events as E

from .base import Checker, Violation
from .text import span

Owner = Tuple[int, str, int]            # (request, purpose, allocating step)


class KVAccounting(Checker):
    name = "kv-accounting"

    def __init__(self, **context) -> None:
        super().__init__()
        self.owned: Dict[int, Owner] = {}
        # per request: how many slots it owns (its slots are found in ``owned`` only
        # when it ends still owning some: a leak)
        self.n_owned: Dict[int, int] = {}
        self.pending: Dict[int, Tuple[int, Owner]] = {}        # slot -> (until batch, owner)
        self.rows: Dict[int, int] = {}                         # row -> request
        self.flagged: Set[int] = set()                         # slots already reported
        self.launched = -1
        self.page_size = 1
        self._leaks: List[tuple] = []                          # found this step, not yet reported
        self._reported_idle = False
        self._reported_host = False
        # the prefix cache: cached slots (writer's owner), lock counts by slot, the lock
        # each request holds (slots, step), requests whose lock outlived them
        self.cached: Dict[int, Owner] = {}
        self.locks: Dict[int, int] = defaultdict(int)
        self.held: Dict[int, Tuple[Tuple[int, ...], int]] = {}
        self.lost: Set[int] = set()
        self._locks_moved = False
        self._reported_locks: Set[int] = set()

    def _v(self, step: int, msg: str, expected: str, seen: str, site: tuple, **details) -> Violation:
        return Violation(self.name, step, msg, expected, seen, site, details)

    # -- slots ----------------------------------------------------------------------------
    def on_Allocated(self, ev: E.Allocated) -> List[Violation]:
        own = (ev.rid, ev.purpose, ev.iteration)
        new = dict.fromkeys(ev.slots, own)
        if (len(new) == len(ev.slots) and self.owned.keys().isdisjoint(new)
                and (not self.pending or self.pending.keys().isdisjoint(new))
                and (not self.cached or self.cached.keys().isdisjoint(new))):
            # nearly every allocation: distinct free slots, taken in one go
            self.owned.update(new)
            self.n_owned[ev.rid] = self.n_owned.get(ev.rid, 0) + len(new)
            return []
        out = []
        for s in ev.slots:
            prev = self.owned.get(s)
            if prev is not None or s in self.pending or s in self.cached:
                what = (f"owned by request {prev[0]} ({prev[1]}, allocated at step {prev[2]})"
                        if prev else f"pending-free until batch {self.pending[s][0]} is processed"
                        if s in self.pending else "held by the prefix cache")
                out.append(self._v(ev.iteration, f"slot {s} allocated to request {ev.rid} twice",
                                   "a slot is allocated only when it is free",
                                   f"slot {s} given to request {ev.rid} ({ev.purpose}) while {what}",
                                   ("double-allocation", ev.purpose), slot=s, rid=ev.rid))
                self._drop(s)
                self.cached.pop(s, None)
            self.owned[s] = (ev.rid, ev.purpose, ev.iteration)
            self.n_owned[ev.rid] = self.n_owned.get(ev.rid, 0) + 1
        return out

    def _drop(self, s: int) -> None:
        own = self.owned.pop(s, None)
        if own is not None:
            n = self.n_owned[own[0]] - 1
            if n:
                self.n_owned[own[0]] = n
            else:                   # a request's zero would stay for the whole run
                del self.n_owned[own[0]]
        self.pending.pop(s, None)

    def on_Freed(self, ev: E.Freed) -> List[Violation]:
        out = []
        for s in ev.slots:
            own = self.owned.get(s)
            if own is None or own[0] != ev.rid:
                if s in self.pending:
                    seen = f"slot {s} is already pending-free (freed by request {self.pending[s][1][0]})"
                    kind = "double-free"
                elif s in self.cached:
                    seen, kind = f"slot {s} is held by the prefix cache", "cached-free"
                elif own is None:
                    seen, kind = f"slot {s} is not owned by anyone", "double-free"
                else:
                    seen, kind = f"slot {s} is owned by request {own[0]} ({own[1]})", "foreign-free"
                out.append(self._v(ev.iteration, f"request {ev.rid} freed slot {s} it does not own "
                                   f"({ev.reason})", f"request {ev.rid} frees only slots it owns",
                                   seen, (kind, ev.reason), slot=s, rid=ev.rid))
                continue
            self._drop(s)
            if ev.pending:
                self.pending[s] = (ev.until, own)
        return out

    def on_PendingReleased(self, ev: E.PendingReleased) -> List[Violation]:
        out = []
        for s in ev.slots:
            p = self.pending.pop(s, None)
            if p is None:
                out.append(self._v(ev.iteration, f"slot {s} returned to the free list but was "
                                   f"not pending-free", "only pending-free slots are released",
                                   f"slot {s} released after batch {ev.batch}",
                                   ("release-not-pending",), slot=s))
            elif p[0] > ev.batch:
                out.append(self._v(ev.iteration, f"slot {s} of request {p[1][0]} released early",
                                   f"released once batch {p[0]} (the last that may read it) "
                                   f"is processed", f"released when batch {ev.batch} was processed",
                                   ("early-release",), slot=s, rid=p[1][0]))
        return out

    # -- the prefix cache ------------------------------------------------------------------
    def on_Cached(self, ev: E.Cached) -> List[Violation]:
        out = []
        for s in ev.slots:
            own = self.owned.get(s)
            if own is None or own[0] != ev.rid:
                out.append(self._v(ev.iteration, f"request {ev.rid} cached slot {s} it does not own",
                                   f"request {ev.rid} hands the prefix cache only slots it owns",
                                   f"slot {s} owned by {own}", ("cache-foreign",), slot=s,
                                   rid=ev.rid))
                continue
            self._drop(s)
            self.cached[s] = own
        return out

    def on_Evicted(self, ev: E.Evicted) -> List[Violation]:
        out = []
        for s in ev.slots:
            own = self.cached.pop(s, None)
            if own is None:
                out.append(self._v(ev.iteration, f"slot {s} evicted but not cached",
                                   "only cached slots are evicted", f"slot {s} evicted",
                                   ("evict-not-cached",), slot=s))
                continue
            if self.locks.get(s, 0):
                holders = sorted(r for r, (sl, _) in self.held.items() if s in sl)
                out.append(self._v(ev.iteration, f"cached slot {s} evicted while locked",
                                   "only unlocked cached slots are evicted",
                                   f"slot {s} locked {self.locks[s]} time(s) (requests "
                                   f"{holders})", ("evict-locked",), slot=s))
            if ev.pending:
                self.pending[s] = (ev.until, own)
        return out

    def on_PrefixLocked(self, ev: E.PrefixLocked) -> List[Violation]:
        self._locks_moved = True
        out = []
        missing = [s for s in ev.slots if s not in self.cached]
        if missing:
            out.append(self._v(ev.iteration, f"request {ev.rid} locked {len(missing)} slots "
                               f"the prefix cache does not hold", "a matched prefix is cached",
                               f"slots {span(missing)} not cached", ("lock-not-cached",),
                               rid=ev.rid, slots=missing))
        if ev.rid in self.held:
            out.append(self._v(ev.iteration, f"request {ev.rid} locked a prefix twice",
                               "one prefix lock per request",
                               f"already holding slots {span(self.held[ev.rid][0])}",
                               ("lock-twice",), rid=ev.rid))
            self._unlock(ev.rid)
        self.held[ev.rid] = (tuple(ev.slots), ev.iteration)
        for s in ev.slots:
            self.locks[s] += 1
        return out

    def _unlock(self, rid: int) -> Tuple[int, ...]:
        slots, _ = self.held.pop(rid)
        for s in slots:
            self.locks[s] -= 1
            if not self.locks[s]:
                del self.locks[s]
        return slots

    def on_PrefixReleased(self, ev: E.PrefixReleased) -> List[Violation]:
        self._locks_moved = True
        if ev.rid not in self.held or ev.rid in self.lost:
            return [self._v(ev.iteration, f"request {ev.rid} released a prefix lock it does "
                            f"not hold", "a lock is released once, by its holder",
                            f"slots {span(ev.slots)} released", ("unlock-not-held",),
                            rid=ev.rid)]
        slots = self._unlock(ev.rid)
        if tuple(ev.slots) != slots:
            return [self._v(ev.iteration, f"request {ev.rid} released another prefix than "
                            f"it locked", f"slots {span(slots)}", f"slots {span(ev.slots)}",
                            ("unlock-other",), rid=ev.rid)]
        return []

    def _lock_leak(self, ev, cause: str) -> None:
        """``ev.rid`` ended with its prefix lock held: the lock leaks (its count stays)."""
        if ev.rid in self.held and ev.rid not in self.lost:
            self.lost.add(ev.rid)
            slots, step = self.held[ev.rid]
            self._reported_locks.update(slots)     # not reported again at idle
            for s in slots:
                self._leaks.append(((ev.rid, "prefix-lock", step), s, ev.iteration, cause))

    def _cache_step(self, snap, it: int) -> List[Violation]:
        """The cache's count and, when a lock moved or at idle, the engine's lock counts
        against the events'; at idle, a cached slot still locked is a leak."""
        out = []
        if len(self.cached) != snap.cached:
            out.append(self._v(it, "prefix cache ledger differs from the events",
                               f"{len(self.cached)} cached slots (events)",
                               f"{snap.cached} cached slots (engine)", ("cache-ledger",)))
        if not (self._locks_moved or snap.idle) or not snap.cached:
            return out
        self._locks_moved = False
        bad = [(s, rid, n) for s, rid, n in snap.cache_ledger
               if n != self.locks.get(s, 0) and s not in self._reported_locks]
        if bad:
            self._reported_locks.update(s for s, _, _ in bad)
            s, rid, n = bad[0]
            out.append(self._v(it, f"{len(bad)} cached slots' lock counts differ from the "
                               f"locks live requests hold", f"slot {s} locked "
                               f"{self.locks.get(s, 0)} time(s) (events)",
                               f"locked {n} time(s) in the engine's tree", ("lock-count",),
                               slots=[b[0] for b in bad]))
        if snap.idle:
            locked = [(s, rid, n) for s, rid, n in snap.cache_ledger
                      if n and s not in self._reported_locks]
            if locked:
                self._reported_locks.update(s for s, _, _ in locked)
                slots = [s for s, _, _ in locked]
                pages = sorted({s // self.page_size for s in slots})
                out.append(self._v(it, f"leak: {len(slots)} cached slots still locked at idle "
                                   f"(no live request holds them)",
                                   "every cached slot unlocked at idle",
                                   f"slots {span(slots)} (pages {span(pages)}) locked",
                                   ("leak", "prefix-lock"), kind="leak", rid=-1,
                                   purpose="prefix-lock", alloc_step=-1, slots=slots,
                                   pages=pages, certain_step=it, cause="locked at idle"))
        return out

    # -- rows -----------------------------------------------------------------------------
    def on_RowAssigned(self, ev: E.RowAssigned) -> List[Violation]:
        prev = self.rows.get(ev.row)
        self.rows[ev.row] = ev.rid
        if prev is not None:
            return [self._v(ev.iteration, f"row {ev.row} assigned to request {ev.rid} twice",
                            "a row is assigned only when free",
                            f"row {ev.row} still held by request {prev}", ("row-double-assign",),
                            row=ev.row, rid=ev.rid)]
        return []

    def on_RowReleased(self, ev: E.RowReleased) -> List[Violation]:
        prev = self.rows.pop(ev.row, None)
        if prev != ev.rid:
            return [self._v(ev.iteration, f"request {ev.rid} released row {ev.row} it does not hold",
                            f"row {ev.row} released by its holder",
                            f"row {ev.row} held by {prev}", ("row-foreign-release",),
                            row=ev.row, rid=ev.rid)]
        return []

    # -- ends of ownership ------------------------------------------------------------------
    def _gone(self, ev, cause: str) -> List[Violation]:
        self._lock_leak(ev, cause)
        held = (sorted(s for s, own in self.owned.items() if own[0] == ev.rid)
                if self.n_owned.get(ev.rid) else ())
        for s in held:
            if s not in self.flagged:
                self.flagged.add(s)
                self._leaks.append((self.owned[s], s, ev.iteration, cause))
        out = []
        if cause != "retract":
            held = [r for r, rid in self.rows.items() if rid == ev.rid]
            for r in held:
                out.append(self._v(ev.iteration, f"request {ev.rid} kept row {r} after it {cause}ed",
                                   f"row {r} released at the {cause}", f"row {r} still held",
                                   ("row-leak", cause), row=r, rid=ev.rid))
                del self.rows[r]
        return out

    def on_Finished(self, ev):
        return self._gone(ev, "finish")

    def on_Aborted(self, ev):
        return self._gone(ev, "abort")

    def on_Retracted(self, ev):
        return self._gone(ev, "retract")

    def on_Launched(self, ev: E.Launched):
        self.launched = max(self.launched, ev.batch)

    # -- every step --------------------------------------------------------------------------
    def on_StepEnd(self, ev: E.StepEnd) -> List[Violation]:
        snap, it = ev.snapshot, ev.iteration
        self.page_size = snap.page_size
        out: List[Violation] = []
        if snap.free + snap.owned + snap.pending + snap.cached != snap.total:
            cached = f" + cached {snap.cached}" if snap.cached else ""
            out.append(self._v(it, "pool formula broken",
                               f"free + owned + pending{' + cached' if cached else ''} == "
                               f"{snap.total}", f"free {snap.free} + owned {snap.owned} + "
                               f"pending {snap.pending}{cached} = "
                               f"{snap.free + snap.owned + snap.pending + snap.cached}",
                               ("formula",)))
        done = min(snap.inflight) - 1 if snap.inflight else self.launched
        for s, (until, own) in list(self.pending.items()):
            if until <= done and s not in self.flagged:
                self.flagged.add(s)
                self._leaks.append((own, s, it, f"pending past batch {until}"))
        if len(self.owned) != snap.owned or len(self.pending) != snap.pending:
            out += self._ledger_diff(snap, it)
        width = snap.row_width
        for r in (snap.requests if snap.live is None else snap.live):   # settled: ended
            if r.committed <= r.allocated and (not width or r.allocated <= width):
                continue
            if r.state in ("finished", "aborted"):
                continue
            if not r.committed <= r.allocated <= (width or r.allocated):
                out.append(self._v(it, f"request {r.rid}: lengths out of order",
                                   f"committed <= allocated <= row width {snap.row_width}",
                                   f"committed {r.committed}, allocated {r.allocated}",
                                   ("lengths",), rid=r.rid))
        if snap.cached or self.cached:
            out += self._cache_step(snap, it)
        out += self._report_leaks()
        if snap.host_total:
            out += self._host_pool(snap, it)
        if (snap.idle and snap.free + snap.cached != snap.total and not self.flagged
                and not self._reported_idle):
            self._reported_idle = True
            cached = f", cached {snap.cached}" if snap.cached else ""
            out.append(self._v(it, "idle engine with KV still held",
                               f"free{' + cached' if cached else ''} == total ({snap.total})",
                               f"free {snap.free}, owned {snap.owned}, pending {snap.pending}"
                               f"{cached}", ("idle-not-full",)))
        return out

    def _host_pool(self, snap, it: int) -> List[Violation]:
        """The KV backup's host pool: its formula every step; at idle, every slot free,
        or a leak naming the requests that still hold host slots."""
        held = len(snap.host_ledger)
        if snap.host_free + held != snap.host_total:
            return [self._v(it, "host pool formula broken",
                            f"free + owned + pending == {snap.host_total} (host pool)",
                            f"free {snap.host_free} + held {held} = {snap.host_free + held}",
                            ("host-formula",))]
        if not snap.idle or not held or self._reported_host:
            return []
        self._reported_host = True
        groups: Dict[tuple, List[int]] = defaultdict(list)
        for s, rid, purpose, step in snap.host_ledger:
            groups[(rid, purpose, step)].append(s)
        (rid, purpose, step), slots = min(groups.items())
        return [self._v(it, f"leak: request {rid} still holds {len(slots)} host-pool "
                            f"{purpose} slots allocated at step {step} at idle "
                            f"({len(groups)} request(s) in all)",
                        f"host pool free == total ({snap.host_total}) at idle",
                        f"free {snap.host_free}; slots {span(slots)} held", ("leak", "host-pool"),
                        kind="leak", rid=rid, purpose=purpose, alloc_step=step, slots=slots)]

    def _ledger_diff(self, snap, it: int) -> List[Violation]:
        """The engine's ledger and the events disagree: name the slots."""
        pend = set(snap.pending_slots)
        engine = {s: (rid, purpose, step) for s, rid, purpose, step in snap.ledger if s not in pend}
        out = []
        for s in sorted(set(engine) - set(self.owned) - self.flagged):
            self.flagged.add(s)
            self._leaks.append((engine[s], s, it, "held though freed"))
        lost = sorted(set(self.owned) - set(engine) - self.flagged)
        if lost:
            self.flagged.update(lost)
            out.append(self._v(it, f"{len(lost)} owned slots vanished from the engine's ledger",
                               "every slot the events say is owned is in the ledger",
                               f"slots {span(lost)} missing (first: request {self.owned[lost[0]][0]})",
                               ("ledger-lost",), slots=lost))
        return out

    def _report_leaks(self) -> List[Violation]:
        if not self._leaks:      # nearly every step
            return []
        groups: Dict[tuple, List[int]] = defaultdict(list)
        for (rid, purpose, step), s, certain, cause in self._leaks:
            groups[(rid, purpose, step, certain, cause)].append(s)
        self._leaks = []
        out = []
        for (rid, purpose, step, certain, cause), slots in sorted(groups.items()):
            pages = sorted({s // self.page_size for s in slots})
            what = (f"leak: request {rid} kept its lock on {len(slots)} cached slots taken at "
                    f"step {step} (certain at step {certain}: {cause})"
                    if purpose == "prefix-lock" else
                    f"leak: request {rid} lost {len(slots)} {purpose} slots allocated at "
                    f"step {step} (certain at step {certain}: {cause})")
            out.append(self._v(
                certain, what,
                f"request {rid} releases its prefix lock at its {cause}" if purpose == "prefix-lock"
                else f"request {rid} holds no KV after its {cause}"
                if cause in ("finish", "abort", "retract") else "its slots are free again",
                f"slots {span(slots)} (pages {span(pages)}) still not free", ("leak", purpose),
                kind="leak", rid=rid, purpose=purpose, alloc_step=step, slots=slots, pages=pages,
                certain_step=certain, cause=cause))
        return out

    def finish(self) -> List[Violation]:
        return self._report_leaks()
