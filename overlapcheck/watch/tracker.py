"""Translate what plain PyTorch does into the race detector's plain events.

The detector (``overlapcheck.race.Detector``) knows contexts, events, memory ids and
rows. PyTorch code knows stream handles, event handles, caching-allocator blocks and
tensors (views of storages). The tracker keeps the mapping, one handler per runtime
fact, for both sources of facts: PyTorch's GPU trace callbacks and the CPU shim.

* A *stream handle* is an int: the ``cudaStream_t`` on a GPU, a shim id on the CPU;
  ``0`` is the default stream. Each handle is one detector context.
* An *event handle* is an int as well; a handle destroyed and created again is a new
  event (its generation is part of the detector's event id).
* Memory is a ``Unit``: a caching-allocator block (device memory, keyed by its
  address) or a host storage that some stream touched (keyed by its address while
  it lives). Rows of a unit are byte ranges in units of ``gran`` bytes, so that the
  rows of a view and the rows of the next owner of the same block compare.
"""
from __future__ import annotations

import functools
import itertools
import weakref
from dataclasses import dataclass, field
from typing import Callable, Dict, FrozenSet, Optional, Set, Tuple

from ..race import HOST, Clock, CtxId, Detector, OpInfo, RaceReport
from .frames import Frames

StreamHandle = int
EventHandle = int
DEFAULT_STREAM: StreamHandle = 0

_MAX_UNITS = 4096   # rows per unit at its first size: sets of row numbers stay small
_MAX_ROWS = 8192    # a view touching more rows than this counts as touching all of them


@dataclass(frozen=True)
class WatchOp(OpInfo):
    """An ``OpInfo`` that also carries the user's stack (innermost first), as
    ``Frames.stack`` takes it, and whether the access is among the kernels an op
    queues after the host waited for it in the middle (``sized``)."""

    stack: Tuple[Tuple[str, int, str], ...] = ()
    after_wait: bool = False


@dataclass
class Unit:
    """One piece of memory as the detector sees it."""

    mem: Tuple
    gran: int                 # bytes per row
    span: int                 # the largest storage seen here, in bytes
    device: bool
    serial: int = 0           # this owner's allocation number (the detector's owner)
    stream: Optional[StreamHandle] = None  # the allocating stream (device memory)
    pledged: Set[StreamHandle] = field(default_factory=set)  # record_stream
    streams: Set[StreamHandle] = field(default_factory=set)  # streams that copied it (host)
    alloc_site: str = "?"
    allocated: bool = False   # host memory: alloc_site is its allocation, not its first copy
    free_site: Optional[str] = None       # where the current owner was freed
    prev_free_site: Optional[str] = None  # where the previous owner was freed
    prev_describe: Optional[str] = None   # the previous owner, as ``describe`` said
    shape: Optional[Tuple[int, ...]] = None
    dtype: str = ""
    pinned: bool = False

    def describe(self, shape: Optional[Tuple[int, ...]] = None) -> str:
        """The owner as a report names it; ``shape``: as the user's code holds it, when
        known (else the shape of the first view seen)."""
        what = "device tensor" if self.device else ("pinned host tensor" if self.pinned
                                                   else "host tensor")
        shape = self.shape if shape is None else shape
        if shape is not None:
            what += f" {self.dtype}{list(shape)}"
        if not self.device:
            how = "allocated" if self.allocated else "first copied"
            return f"{what} {how} at {self.alloc_site}"
        if self.alloc_site == BEFORE:
            return f"{what} allocated before watching began"
        return f"{what} allocated at {self.alloc_site}"

    def rows(self, t) -> Optional[FrozenSet[int]]:
        """The rows view ``t`` can touch; None: all of them."""
        n = t.numel()
        if n == 0:
            return frozenset()
        size = t.element_size()
        lo = t.storage_offset() * size
        extent = 1
        for s, st in zip(t.shape, t.stride()):
            extent += (s - 1) * st
        hi = lo + extent * size
        if lo <= 0 and hi >= self.span:
            return None
        first, last = lo // self.gran, (hi - 1) // self.gran
        if last - first >= _MAX_ROWS:
            return None
        return _row_range(first, last + 1)

    def row_text(self, rows, shape: Optional[Tuple[int, ...]] = None,
                 nbytes: int = 0) -> str:
        """Rows as the user's tensor sees them: dimension-0 indices when they line up.
        ``shape`` and ``nbytes``: the tensor the user's code holds, when known."""
        if rows is None:
            return "all of it"
        lo, hi = min(rows) * self.gran, (max(rows) + 1) * self.gran
        shape, span = (shape, nbytes) if shape is not None else (self.shape, self.span)
        if shape and len(shape) > 0 and shape[0] > 0 and span:
            row_bytes = span // shape[0] if span % shape[0] == 0 else 0
            if row_bytes and lo % row_bytes == 0 and hi % row_bytes == 0:
                a, b = lo // row_bytes, hi // row_bytes - 1
                return f"row {a}" if a == b else f"rows {a}..{b}"
        return f"bytes {lo}..{hi - 1}"


BEFORE = "(before watch)"


@functools.lru_cache(maxsize=4096)
def _row_range(first: int, stop: int) -> FrozenSet[int]:
    """The rows ``first..stop-1`` (the same views recur every step: built once)."""
    return frozenset(range(first, stop))


def _gran(nbytes: int) -> int:
    g = 1
    while g * _MAX_UNITS < nbytes:
        g *= 2
    return g


class Tracker:
    """Feeds one ``Detector``. Handlers never raise on a race: reports go to
    ``on_report(report, unit, user_frame, view)`` (``view``: the tensor the access
    used), and the caller decides."""

    def __init__(self, on_report: Callable, frames: Optional[Frames] = None):
        self.det = Detector()
        self.frames = frames or Frames()
        self.on_report = on_report
        self.stream_ctx: Dict[StreamHandle, CtxId] = {}
        self.stream_site: Dict[StreamHandle, str] = {}
        self.stream_code: Dict[StreamHandle, str] = {}   # name_stream's expressions
        self._ev_gen: Dict[EventHandle, int] = {}
        self.units: Dict[object, Unit] = {}
        self._host_fin: Dict[object, weakref.finalize] = {}
        # pinned host storages allocated under watch: address -> (site, its finalizer)
        self._pinned: Dict[int, Tuple[str, weakref.finalize]] = {}
        self._serial = itertools.count(1)
        self.ops = 0
        self.allocs = 0  # device allocations so far
        self.paused = False  # the watched program is not running (``Watch.paused``)

    # -- streams and events -----------------------------------------------------------
    def ctx(self, sid: StreamHandle) -> CtxId:
        c = self.stream_ctx.get(sid)
        if c is None:
            c = self.stream_created(sid, seen="first used")
        return c

    def stream_created(self, sid: StreamHandle, site: Optional[str] = None,
                       seen: str = "created") -> CtxId:
        """A context for stream ``sid``, named after where it was created (the shim
        knows) or first used (on a GPU, PyTorch reports its pool of streams at once,
        when the first one is taken)."""
        c = self.stream_ctx.get(sid)
        if c is not None:
            return c  # a pooled stream handed out again: the same CUDA stream
        if sid == DEFAULT_STREAM:
            name = "default stream"
        else:
            site = site or self.frames.site(self.frames.user_frame())
            self.stream_site[sid] = site
            name = f"stream {seen} at {site}"
        c = self.stream_ctx[sid] = self.det.add_context(name)
        return c

    def stream_name(self, ctx: CtxId) -> str:
        return self.det.ctx_names[ctx]

    def name_stream(self, sid: StreamHandle, desc: str, code: str) -> None:
        """Name stream ``sid`` by its role (``desc``, e.g. "schedule stream") and by the
        expression that reaches it in the watched code (``code``), for reports."""
        self.det.ctx_names[self.ctx(sid)] = desc
        self.stream_code[sid] = code

    def handle_of(self, ctx: CtxId) -> Optional[StreamHandle]:
        for sid, c in self.stream_ctx.items():
            if c == ctx:
                return sid
        return None

    def event_id(self, h: EventHandle) -> Tuple[EventHandle, int]:
        return (h, self._ev_gen.get(h, 0))

    def event_created(self, h: EventHandle) -> None:
        self._ev_gen[h] = self._ev_gen.get(h, 0) + 1

    def event_deleted(self, h: EventHandle) -> None:
        self._ev_gen[h] = self._ev_gen.get(h, 0) + 1

    def record(self, h: EventHandle, sid: StreamHandle) -> None:
        c = self.ctx(sid)
        self.det.enqueue(c)
        self.det.record(c, self.event_id(h))

    def wait(self, h: EventHandle, sid: StreamHandle) -> None:
        c = self.ctx(sid)
        self.det.enqueue(c)
        self.det.wait(c, self.event_id(h))

    def sync_event(self, h: EventHandle) -> None:
        self.det.host_sync_event(self.event_id(h))

    def sync_stream(self, sid: StreamHandle) -> None:
        self.det.host_sync_stream(self.ctx(sid))

    def sync_device(self) -> None:
        self.det.host_sync_all()

    def enqueue(self, sid: StreamHandle) -> Tuple[CtxId, Clock]:
        c = self.ctx(sid)
        return c, self.det.enqueue(c)

    # -- memory ---------------------------------------------------------------------
    def _site(self) -> str:
        return self.frames.site(self.frames.user_frame())

    def device_alloc(self, key, sid: StreamHandle, nbytes: int = 0,
                     site: Optional[str] = None) -> Unit:
        """A caching-allocator block at ``key`` goes to a new owner on stream ``sid``."""
        u = self.units.get(key)
        if u is None:  # the row size is fixed by the first storage seen at this address
            u = self.units[key] = Unit(("device", key), _gran(nbytes) if nbytes else 0,
                                       nbytes, True)
        if u.serial:
            u.prev_describe = u.describe()
        self.allocs += 1
        u.serial = next(self._serial)
        u.stream, u.pledged = sid, set()
        u.prev_free_site, u.free_site = u.free_site, None
        u.alloc_site = site or self._site()
        u.shape, u.dtype = None, ""
        u.span = max(u.span, nbytes)
        self.ctx(sid)
        self.det.alloc(u.mem, u.describe(), u.serial)
        return u

    def device_free(self, key) -> None:
        """The block goes back to its allocator: not an access. The streams pledged
        with ``record_stream`` are ordered before its next owner's accesses."""
        u = self.units.get(key)
        if u is None:
            return
        u.free_site = self._site()
        pledged = [self.ctx(s) for s in sorted(u.pledged) if s != u.stream]
        self.det.free(u.mem, pledged)

    def record_stream(self, u: Unit, sid: StreamHandle) -> None:
        if sid != u.stream:
            u.pledged.add(sid)

    def device_unit(self, key, t) -> Unit:
        """The unit of device tensor ``t`` whose block is ``key``; a block allocated
        before watching began is adopted on first sight."""
        u = self.units.get(key)
        if u is None:
            nbytes = t.untyped_storage().nbytes()
            u = self.device_alloc(key, DEFAULT_STREAM, nbytes, site=BEFORE)
        if u.shape is None:
            self._learn(u, t)
        return u

    def host_unit(self, key, t, pinned: bool) -> Unit:
        """The unit of host storage ``key`` (``t`` views it), created when a stream
        first touches it."""
        u = self.units.get(("host", key))
        if u is None:
            nbytes = t.untyped_storage().nbytes()
            u = Unit(("host", key), _gran(nbytes), nbytes, False)
            self.units[("host", key)] = u
        if u.serial == 0:
            u.serial = next(self._serial)
            made = self._pinned.get(key)
            u.alloc_site = made[0] if made else self._site()
            u.allocated, u.pinned, u.streams = made is not None, pinned, set()
            self._learn(u, t)
            self.det.alloc(u.mem, u.describe(), u.serial)
            self._host_fin[key] = weakref.finalize(t.untyped_storage(), self.host_dead, key)
        return u

    def pinned_allocated(self, key, t) -> None:
        """Pinned host memory at ``key`` (``t`` views it) was allocated at the user's
        line now: a report on it names this line rather than its first copy."""
        old = self._pinned.pop(key, None)
        if old is not None:
            old[1].detach()
        fin = weakref.finalize(t.untyped_storage(), self._pinned.pop, key, None)
        self._pinned[key] = (self._site(), fin)

    def host_unit_if_tracked(self, key) -> Optional[Unit]:
        u = self.units.get(("host", key))
        return u if u is not None and u.serial else None

    def host_dead(self, key) -> None:
        """A tracked host storage died. The allocator of pinned memory reuses it only
        once the copies that used it are done, so those streams are pledged."""
        self._host_fin.pop(key, None)
        u = self.units.get(("host", key))
        if u is None or not u.serial:
            return
        self.det.free(u.mem, [self.ctx(s) for s in sorted(u.streams)])
        u.serial, u.shape = 0, None

    def _learn(self, u: Unit, t) -> None:
        """Shape and size of a unit's owner, from the first view of it seen."""
        base = t._base if t._base is not None else t
        u.shape, u.dtype = tuple(base.shape), str(base.dtype).replace("torch.", "")
        nbytes = t.untyped_storage().nbytes()
        u.span = max(u.span, nbytes)
        if not u.gran:
            u.gran = _gran(nbytes)

    def close(self) -> None:
        """Stop following host storages (their finalizers would outlive the context)."""
        for fin in self._host_fin.values():
            fin.detach()
        self._host_fin.clear()
        for _, fin in self._pinned.values():
            fin.detach()
        self._pinned.clear()

    # -- accesses ---------------------------------------------------------------------
    def op(self, name: str, is_copy: bool = False) -> Tuple[WatchOp, object]:
        """The op record for an access issued now, and the user's frame issuing it."""
        f = self.frames.user_frame()
        return WatchOp(name, self.frames.site(f), is_copy, self.frames.stack(f)), f

    def access(self, ctx: CtxId, clock: Optional[Clock], u: Unit, t, write: bool,
               op: WatchOp, frame) -> Optional[RaceReport]:
        __tracebackhide__ = True
        rows = u.rows(t)
        if rows is not None and not rows:
            return None
        rep = self.det.access(ctx, u.mem, write, rows, op, clock)
        if rep is not None:
            self.on_report(rep, u, frame, t)
        return rep

    def host_access(self, u: Unit, t, write: bool, op: WatchOp, frame) -> Optional[RaceReport]:
        __tracebackhide__ = True
        return self.access(HOST, None, u, t, write, op, frame)
