"""The happens-before race detector core.

It knows nothing of streams objects, tensors or runtimes: it is fed plain events
(context creation, launch, event record/wait, synchronizations, accesses, memory
allocation/free/ownership changes) and returns ``RaceReport`` objects. The device
runtimes (``overlapcheck.device``) and, later, an interposer for unmodified
``torch.cuda`` code feed it.

Clock rules (CUDA's):
* the host enqueuing work on a stream orders the host's past before that work;
* ``record`` snapshots the stream's clock into the event; ``wait`` joins the
  snapshot taken by the latest record *at the time of the wait* (a wait on a never
  recorded event is a no-op);
* a host synchronization (stream, event, device, a blocking copy, a query that
  returned true) joins the waited-for clock into the host;
* every time a context's clock is handed to another, its own entry is bumped, so
  later accesses of that context are not mistaken as ordered.

All clocks are computed in the host's issue order, so the verdict does not depend on
when device work really ran: stream work carries the clock it had when it was
enqueued, and may be checked later (the sim checks it when the work retires).

Memory reuse: freeing is not an access. A memory unit keeps its access records when it
changes owner; the new owner's accesses are checked against the previous owner's like
any others, and a conflict across owners is reported as ``reuse``.
"""
from __future__ import annotations

from typing import Dict, Hashable, Iterable, List, Optional

from . import report as R
from .clocks import HOST, Clock, CtxId, get, join_into
from .report import Access, OpInfo, RaceReport, Rows

MemId = Hashable
EventId = Hashable


_HIST = 8  # ownership changes remembered per memory unit and per row


def _owner_at(hist: list, epoch: int, default: object = None) -> object:
    for e, owner in reversed(hist):
        if e <= epoch:
            return owner
    return default


# An access record: (context, epoch, clock, write, rows, op); an ``Access`` is made of
# it only when a report names it.
_Rec = tuple


class _Mem:
    """One memory unit: its access records and its ownership history, stamped with
    the host epoch of each change, so that an access is attributed to the owner at
    the time the host issued it (device work may run much later)."""

    __slots__ = ("name", "records", "hist", "row_hist", "pledges", "fence")

    def __init__(self, name: str):
        self.name = name
        self.records: List[_Rec] = []
        self.hist: list = []
        self.row_hist: Dict[int, list] = {}
        self.pledges: List[Clock] = []
        self.fence: Clock = []   # work the allocator waited for before handing it out again

    def set_owner(self, epoch: int, owner: object) -> None:
        self.hist.append((epoch, owner))
        del self.hist[:-_HIST]

    def set_row_owner(self, epoch: int, row: int, owner: object) -> None:
        h = self.row_hist.setdefault(row, [])
        h.append((epoch, owner))
        del h[:-_HIST]

    def owner_of(self, rows: Rows, epoch: int) -> object:
        base = _owner_at(self.hist, epoch)
        if rows is None or not self.row_hist:
            return base
        owners = {_owner_at(self.row_hist[r], epoch, base) if r in self.row_hist else base
                  for r in rows}
        if len(owners) == 1:
            return owners.pop()
        return tuple(sorted(map(str, owners)))


class Detector:
    """Vector-clock race detector. Handlers return the reports they produce and also
    append them to ``self.reports``; they never raise on a race."""

    def __init__(self) -> None:
        self.ctx_names: List[str] = ["host"]
        self.clocks: List[Clock] = [[1]]
        self.events: Dict[EventId, Clock] = {}
        self.mem: Dict[MemId, _Mem] = {}
        self.reports: List[RaceReport] = []
        self.accesses = 0

    # -- contexts and clocks -------------------------------------------------------
    def add_context(self, name: str) -> CtxId:
        ctx = len(self.clocks)
        clock = [0] * (ctx + 1)
        clock[ctx] = 1
        self.clocks.append(clock)
        self.ctx_names.append(name)
        return ctx

    def _release(self, ctx: CtxId) -> Clock:
        """Snapshot ``ctx``'s clock for another context, then bump ``ctx``."""
        clock = self.clocks[ctx]
        snap = list(clock)
        clock[ctx] += 1
        return snap

    def enqueue(self, stream: CtxId) -> Clock:
        """The host enqueues work on ``stream``; returns the clock that work runs
        under (a snapshot)."""
        host = self.clocks[HOST]
        dst = self.clocks[stream]
        if len(dst) < len(host):
            dst.extend([0] * (len(host) - len(dst)))
        for i, v in enumerate(host):     # join the host's clock (before its bump)
            if v > dst[i]:
                dst[i] = v
        host[HOST] += 1
        return list(dst)

    def record(self, stream: CtxId, event: EventId) -> None:
        self.events[event] = self._release(stream)

    def wait(self, stream: CtxId, event: EventId) -> None:
        snap = self.events.get(event)
        if snap is not None:  # a wait on a never-recorded event is a no-op
            join_into(self.clocks[stream], snap)

    def host_sync_stream(self, stream: CtxId) -> None:
        join_into(self.clocks[HOST], self._release(stream))

    def host_sync_event(self, event: EventId) -> None:
        snap = self.events.get(event)
        if snap is not None:
            join_into(self.clocks[HOST], snap)

    def host_sync_all(self) -> None:
        for ctx in range(1, len(self.clocks)):
            self.host_sync_stream(ctx)

    def clock(self, ctx: CtxId) -> Clock:
        """A snapshot of ``ctx``'s current clock."""
        return list(self.clocks[ctx])

    # -- memory ----------------------------------------------------------------------
    def _host_epoch(self) -> int:
        return self.clocks[HOST][HOST]

    def alloc(self, mem: MemId, name: str, owner: object = None) -> None:
        """Memory ``mem`` gets a new owner. Reused memory keeps its access records;
        the work of the streams pledged at its free is ordered before every later
        access *to this memory* (the caching allocator hands the block out only once
        that work is done). It is not an edge for the host in general: whether the
        allocator reused this block or took a fresh one depends on GPU timing, and a
        race elsewhere must not hide behind it."""
        m = self.mem.get(mem)
        if m is None:
            m = self.mem[mem] = _Mem(name)
        if m.pledges:
            for snap in m.pledges:
                join_into(m.fence, snap)
            m.pledges = []
        m.name = name
        e = self.clocks[HOST][HOST]       # ``set_owner`` and ``set_row_owner``, inlined
        h = m.hist
        h.append((e, owner))
        if len(h) > _HIST:
            del h[:-_HIST]
        for h in m.row_hist.values():
            h.append((e, owner))
            if len(h) > _HIST:
                del h[:-_HIST]

    def free(self, mem: MemId, pledged: Iterable[CtxId] = ()) -> None:
        """``mem`` goes back to its allocator; not an access. ``pledged`` are the
        streams promised with ``record_stream``."""
        m = self.mem.get(mem)
        if m is None:
            return
        h = m.hist                        # ``set_owner``, inlined
        h.append((self.clocks[HOST][HOST], None))
        if len(h) > _HIST:
            del h[:-_HIST]
        m.pledges = [self._release(s) for s in pledged] if pledged else []

    def transfer(self, mem: MemId, rows: Iterable[int], owner: object) -> None:
        """Rows of ``mem`` (KV slots, request-pool rows) change owner (``None``: free)."""
        m = self.mem[mem]
        e = self.clocks[HOST][HOST]
        row_hist = m.row_hist
        for r in rows:                    # ``set_row_owner``, inlined
            h = row_hist.get(r)
            if h is None:
                h = row_hist[r] = []
            h.append((e, owner))
            if len(h) > _HIST:
                del h[:-_HIST]

    # -- accesses --------------------------------------------------------------------
    def prune(self, floor: Clock) -> int:
        """Forget the records no access to come can race with. ``floor`` bounds from
        below every clock a later access will run under (the caller's: the host's
        clock and those of work queued but not yet checked); a record of context c
        at epoch e with ``floor[c] >= e`` happens before all of them, so it can
        neither race nor be reported. Returns how many records were dropped."""
        n, dropped = len(floor), 0
        for m in self.mem.values():
            recs = m.records
            if recs:
                keep = [r for r in recs if (floor[r[0]] if r[0] < n else 0) < r[1]]
                if len(keep) != len(recs):
                    dropped += len(recs) - len(keep)
                    m.records = keep
        return dropped

    def access(self, ctx: CtxId, mem: MemId, write: bool, rows: Rows, op: OpInfo,
               clock: Optional[Clock] = None) -> Optional[RaceReport]:
        """Check one access and remember it. ``clock`` is the clock the access runs
        under (for stream work: the snapshot ``enqueue`` returned); by default the
        context's current clock."""
        return self.access_all(ctx, clock, op, ((mem, write, rows),), True)

    def access_all(self, ctx: CtxId, clock: Optional[Clock], op: OpInfo, accesses,
                   stop: bool) -> Optional[RaceReport]:
        """``access`` of each ``(mem, write, rows)`` of ``accesses`` in turn, all of one
        op under ``clock`` (a launch's declared accesses: one call instead of one per
        access, about a microsecond less each). With ``stop``, returns at the first
        race, leaving the accesses after it unchecked (a runtime that raises on a race);
        else checks all and returns the last race's report (each is in ``reports``)."""
        if clock is None:
            clock = list(self.clocks[ctx])
        n = len(clock)
        epoch = clock[ctx] if ctx < n else 0
        mems = self.mem
        last = None
        for mem, write, rows in accesses:
            if rows is not None and not rows:
                continue
            self.accesses += 1
            m = mems[mem]
            records = m.records
            if not records:              # nothing to check against (common: a fresh block)
                m.records = [(ctx, epoch, clock, write, rows, op)]
                continue
            fence = m.fence
            nf = len(fence)
            found = None         # the previous record of the race to report
            keep: List[_Rec] = []
            for prev in records:
                pctx, pep, pclock, pwrite, prows, _ = prev
                if prows is not None and rows is not None and prows.isdisjoint(rows):
                    keep.append(prev)
                    continue
                if (pctx == ctx or (clock[pctx] if pctx < n else 0) >= pep
                        or (fence[pctx] if pctx < nf else 0) >= pep):
                    # Ordered before this access: forgotten when covered by it and no
                    # longer able to race on its own (a write covers anything; a read
                    # covers reads).
                    if ((rows is None or (prows is not None and prows <= rows))
                            and (write or not pwrite)):
                        continue
                elif (write or pwrite) and (pclock[ctx] if ctx < len(pclock) else 0) < epoch:
                    # nor after: a race
                    if found is None or pep >= found[1]:
                        found = prev
                keep.append(prev)
            cur = (ctx, epoch, clock, write, rows, op)
            keep.append(cur)
            m.records = keep
            if found is None:
                continue
            prows = found[4]      # the rows both touch
            both = rows if prows is None else prows if rows is None else prows & rows
            last = self._report(m, both, cur, found)
            self.reports.append(last)
            if stop:
                return last
        return last

    def _report(self, m: _Mem, rows: Rows, cur: "_Rec", prev: "_Rec") -> RaceReport:
        # Ownership is judged on the rows both accesses touch, each at its issue time.
        a, b = (Access(r[0], self.ctx_names[r[0]], r[1], r[2], r[3], r[4],
                       m.owner_of(rows, get(r[2], HOST)), r[5]) for r in (cur, prev))
        return RaceReport(self._kind(b, a), m.name, rows, a, b)

    @staticmethod
    def _kind(prev: Access, cur: Access) -> str:
        if (prev.owner is not None and cur.owner is not None and prev.owner != cur.owner):
            return R.REUSE
        if cur.ctx == HOST or prev.ctx == HOST:
            host, dev = (cur, prev) if cur.ctx == HOST else (prev, cur)
            if dev.op.is_copy and dev.write and not host.write:
                return R.HOST_READ_BEFORE_COPY
            if dev.op.is_copy and not dev.write and host.write:
                return R.HOST_WRITE_DURING_COPY
            return R.HOST_STREAM
        return R.STREAM_STREAM
