"""The device runtime API, shared by the ``sim`` and ``cuda`` backends.

The engine is written once against this API:

* streams: ``rt.new_stream(name)``, ``s.wait_event(e)``, ``s.wait_stream(t)``,
  ``s.synchronize()``;
* events: ``rt.new_event(name)``, ``e.record(s)``, ``e.query()``, ``e.synchronize()``;
* buffers: ``rt.empty(...)`` (device), ``rt.host_empty(..., pinned=True)``;
  ``rt.free(buf)``, ``rt.record_stream(buf, s)``; ownership of rows:
  ``rt.transfer(buf, rows, owner)`` (``owner=None``: freed);
* device work: ``rt.launch(s, fn, *args, name=..., reads=..., writes=...)`` and
  ``rt.copy(dst, src, s, non_blocking=...)``;
* host access to device or pinned values, only through ``rt.to_host(buf, s)``,
  ``rt.host_view(buf)`` (or ``rt.host_list(buf)``: its values as lists),
  ``rt.host_write(buf, values)``;
* ``rt.synchronize()``.

``reads``/``writes`` declare (and may narrow, with ``buf.rows(...)``) a launch's
accesses. With ``access="infer"`` (the default) every launch runs under the access
inference mode, and declarations are checked against what the closure really did: an
access outside them raises ``AnnotationError``. With ``access="declared"``, a launch
that declares its accesses is not intercepted (the fast mode). With ``access="audit"``,
a sample of the declared launches (``Runtime._audits``) is intercepted too, the
declaration is fed to the detector as in the declared mode, and an access outside it is
a report (``device/audit.py``), not an exception.
"""
from __future__ import annotations

import os
import sys
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from numpy import ndarray as _ndarray
from torch import Tensor as _Tensor

from ..race import Detector, OpInfo, RaceReport
from . import ACCESS_MODES
from .twins import check_twin, twin_failed
from .buffers import DEVICE, PAGEABLE, PINNED, Buffer, Region, as_region
from .infer import AccessSet, InferMode


_EMPTY: frozenset = frozenset()
# access="audit": every launch of a name up to this many is audited, then those counted
# 4, 16, 64, ... (``Runtime._audits``)
AUDIT_FIRST = 2
# how often (in detector accesses) records every later access is ordered after are
# forgotten: without it, records of row sets no later access covers pile up (§3.5)
_PRUNE_EVERY = 2048


FILL = "fill "     # the op name of an allocation's poison fill is this and the buffer's


def is_fill(op: OpInfo) -> bool:
    """Is ``op`` an allocation's poison fill (``Runtime._fill``)?"""
    return op.name.startswith(FILL)


class AnnotationError(Exception):
    """A launch touched memory outside its declared accesses."""


class DuplicateWriteError(AnnotationError):
    """A launch wrote one index of a tracked buffer twice with different values in one
    indexed write (sim, exact inference): CPU keeps the last, CUDA any of them."""


class StuckWait(RuntimeError):
    """A host wait that can never complete: the device work it needs waits, directly or
    through other streams, for a host action that comes only after the wait (a flag the
    host sets later, a collective some rank never joins). On a GPU this hangs; the sim
    raises it, naming the host wait and the stuck device wait."""

    def __init__(self, host_wait: str, stream: str, waits_for: str):
        super().__init__(f"{host_wait} can never complete: stream '{stream}' is stuck in "
                         f"'wait {waits_for}', which only a later host action can satisfy")
        self.host_wait, self.stream, self.waits_for = host_wait, stream, waits_for


class RaceError(Exception):
    """Raised by ``on_race="raise"``: the first race report."""

    def __init__(self, report: RaceReport):
        super().__init__(str(report))
        self.report = report


_PKG_DIRS = tuple(os.path.dirname(os.path.abspath(p)) + os.sep for p in (
    __file__, sys.modules["overlapcheck.race"].__file__))


_USER_FILES: Dict[str, Optional[str]] = {}   # file name -> its base name, None: ours or torch's


def _user_file(fn: str) -> Optional[str]:
    base = _USER_FILES.get(fn, 0)
    if base == 0:
        ours = fn.startswith(_PKG_DIRS) or "torch" + os.sep in fn
        base = _USER_FILES[fn] = None if ours else os.path.basename(fn)
    return base


# (id of a user frame's code, instruction) -> (the code, its ``file:line``); the code is
# kept (compared by identity: hashing a code object hashes its bytecode). Keyed by the
# instruction: a frame's line is found by scanning its code's line table.
_AT: Dict[tuple, tuple] = {}


def user_frame(depth: int = 2) -> str:
    """``file:line`` of the innermost frame outside the device runtime and the
    detector (the user's call site)."""
    f = sys._getframe(depth)
    code = f.f_code
    key = (id(code), f.f_lasti)
    hit = _AT.get(key)
    if hit is not None and hit[0] is code:
        return hit[1]
    base = _user_file(code.co_filename)
    if base is not None:
        at = f"{base}:{f.f_lineno}"
        _AT[key] = (code, at)
        return at
    while f is not None:
        base = _user_file(f.f_code.co_filename)
        if base is not None:
            return f"{base}:{f.f_lineno}"
        f = f.f_back
    return "?"


class Stream:
    __slots__ = ("rt", "name", "ctx", "raw", "_joins")

    def __init__(self, rt: "Runtime", name: str, ctx: int, raw=None):
        self.rt, self.name, self.ctx, self.raw = rt, name, ctx, raw
        self._joins: Dict[int, "Event"] = {}   # other stream's ctx -> the event wait_stream uses

    def wait_event(self, event: "Event") -> None:
        self.rt._wait_event(self, event)

    def wait_stream(self, other: "Stream") -> None:
        """A record on ``other`` and a wait for it. One event per pair of streams serves
        every call: a wait binds to the record just made, whatever comes later."""
        ev = self._joins.get(other.ctx)
        if ev is None:
            ev = self._joins[other.ctx] = self.rt.new_event(f"{self.name}<-{other.name}")
        ev.record(other)
        self.wait_event(ev)

    def synchronize(self) -> None:
        self.rt._sync_stream(self)

    def __repr__(self) -> str:
        return f"Stream({self.name})"


class Event:
    __slots__ = ("rt", "name", "id", "raw", "last")

    def __init__(self, rt: "Runtime", name: str, eid: int, raw=None):
        self.rt, self.name, self.id, self.raw = rt, name, eid, raw
        self.last = None  # backend-specific handle of the latest record

    def record(self, stream: Stream) -> None:
        self.rt._record(self, stream)

    def query(self) -> bool:
        return self.rt._query(self)

    def synchronize(self) -> None:
        self.rt._sync_event(self)

    def __repr__(self) -> str:
        return f"Event({self.name})"


class Runtime:
    """Backend-independent part: the public operations, buffer registry, detector
    feeding, access inference and declaration checks. A backend implements only the
    raw device semantics (the ``_raw_*`` hooks and allocation) and says what it can
    do through capability flags; callers ask those, never the backend's name.

    Capabilities:

    * ``replayable``: device work is deferred and every scheduling decision is
      recorded in ``choices``; ``Replay(choices)`` reruns a run exactly (sim).
    * ``host_flags``: device work can wait on a host flag (``new_flag``/``wait_flag``),
      as logical tensor-parallel ranks need (sim).
    * ``cpu_work``: device work runs as CPU tensor ops: one intra-op thread is best.
    * ``exact_rows``: access inference sees index values (sim: they live on the host).
    * ``gpu``: a real accelerator runs the work.
    * ``graphs``: model calls replay from CUDA graphs (cuda, detector off).

    The detector is fed here and only here: every op queued on a stream takes a clock
    from ``det.enqueue`` at the host call that queues it, so the verdict follows the
    host's issue order on both backends, whatever the device really did."""

    backend = "?"
    replayable = False
    host_flags = False
    cpu_work = False
    exact_rows = False
    gpu = False
    graphs = False

    def __init__(self, detect: bool = True, access: str = "infer", on_race: str = "collect"):
        if access not in ACCESS_MODES:
            raise ValueError(f"unknown access mode {access!r} (choose from {', '.join(ACCESS_MODES)})")
        if on_race not in ("collect", "raise"):
            raise ValueError(f"unknown on_race {on_race!r} (collect or raise)")
        self.det: Optional[Detector] = Detector() if detect else None
        self.access = access
        self.on_race = on_race
        self.streams: List[Stream] = []
        self._by_storage: Dict[int, Buffer] = {}
        self._live: Dict[str, int] = {}     # buffers allocated and not yet freed, by name (no zeros)
        self._live_seen: Optional[Dict[str, int]] = None   # ``_live`` when last sorted
        self._live_sorted: Tuple[Tuple[str, int], ...] = ()
        self._serial = 0
        self._events = 0
        self.syncs = 0           # host synchronizations so far
        self.wait_s = 0.0        # seconds the host was blocked in them (a backend that blocks)
        self.launches = 0
        self.choices: List[int] = []   # recorded scheduling decisions (replayable backends)
        self._infos: Dict[tuple, OpInfo] = {}   # (name, frame, copy) -> its OpInfo, shared
        # (name, id of the calling code, line, copy) -> (that code, the OpInfo): ``_info``
        self._sites: Dict[tuple, tuple] = {}
        # run kernels' host twins where nothing intercepts (CPU work, no graphed model calls)
        self.host_runs = self.cpu_work and not self.graphs
        self.check_twins = False   # twins="check": each twin launch runs its kernel too
        self._arrays: Dict[int, tuple] = {}    # id(tensor) -> (tensor, its numpy view)
        self._prune_at = _PRUNE_EVERY     # detector accesses at which records are pruned
        self._audit_seen: Dict[str, int] = {}   # access="audit": launches so far, by name

    def dispose(self) -> None:
        """Empty this runtime (its streams and events point back at it): a finished
        run's object graph is then freed by reference counting, not by the cyclic
        collector (``Session.dispose``). Nothing may use it afterwards."""
        self.__dict__.clear()

    # -- reports ---------------------------------------------------------------------
    @property
    def reports(self) -> List[RaceReport]:
        return self.det.reports if self.det is not None else []

    def _raise_on(self, rep: Optional[RaceReport]) -> None:
        if rep is not None and self.on_race == "raise":
            raise RaceError(rep)

    def _point(self) -> None:
        """A host runtime call: a choice point on a backend that schedules device work
        itself (the sim); nothing on a real device."""

    def host_choice(self, names: Sequence[str]) -> int:
        """Which of the runnable host threads ``names`` runs next (an index into them;
        docs/design.md §4.14). A host choice point: on a backend that schedules device
        work itself (the sim) the schedule decides, recorded in ``choices``; elsewhere the
        first, so that the order never depends on real threads."""
        return 0

    def _clock(self, stream: Stream):
        """The detector clock of an op the host queues on ``stream`` now."""
        return self.det.enqueue(stream.ctx) if self.det is not None else None

    def _info(self, name: str, is_copy: bool = False, depth: int = 3) -> OpInfo:
        """The op's ``OpInfo`` (its user frame only with the detector on); equal ones are
        one shared object (they are immutable). Where the caller's frame is the user's,
        the op's site is kept per (name, code, instruction): one lookup per launch (an
        instruction has one line; a frame's line is found by scanning its code's line
        table, its instruction is at hand)."""
        if self.det is None:
            frame = "?"
        else:
            f = sys._getframe(depth - 1)    # as ``user_frame(depth)`` sees it
            code = f.f_code
            site = (name, id(code), f.f_lasti, is_copy)
            hit = self._sites.get(site)
            if hit is not None and hit[0] is code:
                return hit[1]
            frame = user_frame(depth)
            if _user_file(code.co_filename) is not None:   # not a walk up the stack
                info = self._op_info(name, frame, is_copy)
                self._sites[site] = (code, info)
                return info
        return self._op_info(name, frame, is_copy)

    def _op_info(self, name: str, frame: str, is_copy: bool) -> OpInfo:
        key = (name, frame, is_copy)
        info = self._infos.get(key)
        if info is None:
            info = self._infos[key] = OpInfo(*key)
        return info

    # -- streams and events ----------------------------------------------------------
    def new_stream(self, name: str) -> Stream:
        ctx = self.det.add_context(name) if self.det is not None else len(self.streams) + 1
        s = Stream(self, name, ctx, self._raw_stream(name))
        self.streams.append(s)
        return s

    def new_event(self, name: str = "event") -> Event:
        self._events += 1
        return Event(self, name, self._events, self._raw_event())

    def _record(self, event: Event, stream: Stream) -> None:
        self._point()
        event.last = self._raw_record(event, stream, self._clock(stream))
        if self.det is not None:
            self.det.record(stream.ctx, event.id)

    def _wait_event(self, stream: Stream, event: Event) -> None:
        self._point()
        if event.last is None:
            return  # CUDA: waiting on a never-recorded event is a no-op
        self._raw_wait(stream, event, self._clock(stream))
        if self.det is not None:
            self.det.wait(stream.ctx, event.id)

    def _query(self, event: Event) -> bool:
        self._point()
        if event.last is None:
            return True   # CUDA: a never-recorded event has completed
        done = self._raw_query(event)
        if done and self.det is not None:
            self.det.host_sync_event(event.id)
        return done

    def _sync_event(self, event: Event) -> None:
        self._point()
        self.syncs += 1
        if event.last is None:
            return
        self._raw_sync_event(event)
        if self.det is not None:
            self.det.host_sync_event(event.id)

    def _sync_stream(self, stream: Stream) -> None:
        self._point()
        self.syncs += 1
        self._raw_sync_stream(stream, f"host synchronize on stream '{stream.name}'")
        if self.det is not None:
            self.det.host_sync_stream(stream.ctx)

    def synchronize(self) -> None:
        """Host waits for all device work."""
        self._point()
        self.syncs += 1
        self._raw_sync_all()
        if self.det is not None:
            self.det.host_sync_all()

    # -- buffers ---------------------------------------------------------------------
    def live_buffers(self) -> Tuple[Tuple[str, int], ...]:
        """Buffers allocated through this runtime and not freed: (name, count), by name."""
        live = self._live
        if live != self._live_seen:     # a step's allocations and frees mostly cancel out
            self._live_seen = dict(live)
            self._live_sorted = tuple(sorted(live.items()))
        return self._live_sorted

    def _register(self, buf: Buffer, ptr: Optional[int] = None) -> Buffer:
        """``ptr``: the storage address, when the caller knows it (a reused block)."""
        self._live[buf.name] = self._live.get(buf.name, 0) + 1
        if ptr is None:
            ptr = buf.t.untyped_storage().data_ptr()
        buf.ptr = ptr
        self._by_storage[ptr] = buf
        if self.det is not None:
            self.det.alloc(buf.mem, buf.name, buf.owner)
        return buf

    def _unregister(self, buf: Buffer, keep_lookup: bool) -> None:
        if buf.freed:
            raise ValueError(f"double free of buffer {buf.owner}")
        buf.freed = True
        n = self._live[buf.name] - 1
        if n:
            self._live[buf.name] = n
        else:
            del self._live[buf.name]
        if not keep_lookup:
            self._by_storage.pop(buf.ptr, None)
        if self.det is not None:
            self.det.free(buf.mem, [s.ctx for s in buf.pledged])

    def _fill(self, buf: Buffer, stream: Optional[Stream] = None) -> None:
        """The poison fill of a fresh allocation (``buffers.poison_value``), an access like
        any other: a write of the whole buffer by the allocating ``stream`` (device memory,
        a fill kernel queued there on a GPU; its clock is the stream's joined with the
        host's, as the host's enqueue gives it, without moving either) or by the host
        (``stream`` None: pinned and pageable memory, filled before the allocation
        returns). So work on another stream that touches the buffer, a zeroing included,
        must be ordered after the allocating stream. A block the allocator hands back is
        not filled (it keeps its stale values) and makes no access."""
        det = self.det
        if det is None:
            return
        info = self._info(FILL + buf.name, False, 4)
        if stream is None:
            rep = det.access_all(0, None, info, ((buf.mem, True, None),), False)
        else:
            clock = list(det.clocks[stream.ctx])
            for i, v in enumerate(det.clocks[0]):
                if i >= len(clock):
                    clock.append(v)
                elif v > clock[i]:
                    clock[i] = v
            rep = det.access_all(stream.ctx, clock, info, ((buf.mem, True, None),), False)
        self._raise_on(rep)

    def _next_serial(self) -> int:
        self._serial += 1
        return self._serial

    def record_stream(self, buf: Buffer, stream: Stream) -> None:
        """Promise the allocator that ``stream`` uses ``buf``: its memory is not
        reused until the work ``stream`` has queued by the free is done."""
        if stream not in buf.pledged and stream is not buf.stream:
            buf.pledged.append(stream)
        self._raw_record_stream(buf, stream)

    def transfer(self, buf: Buffer, rows: Iterable[int], owner: object) -> None:
        """Rows of ``buf`` change owner (``None``: freed). Not an access: the new
        owner's first accesses are checked against the previous owner's last ones."""
        if self.det is not None:
            self.det.transfer(buf.mem, rows, owner)

    # -- device work -------------------------------------------------------------------
    def launch(self, stream: Stream, fn, *args, name: Optional[str] = None, reads=None,
               writes=None, **kwargs) -> None:
        """Queue ``fn(*args, **kwargs)`` on ``stream``. ``reads``/``writes`` declare its
        accesses (buffers or ``buf.rows(...)`` regions)."""
        self._point()
        self.launches += 1
        info = self._info(name or getattr(fn, "__name__", "kernel"))
        det = self.det
        if det is None:
            self._raw_launch(stream, fn, args, kwargs, info, None, None)
        else:
            declared = self._declared(reads, writes)
            self._raw_launch(stream, fn, args, kwargs, info, declared, det.enqueue(stream.ctx))

    def copy(self, dst: Buffer, src: Buffer, stream: Stream, non_blocking: bool = False,
             name: Optional[str] = None) -> None:
        """``dst <- src`` in ``stream`` order. Asynchronous for the host only when
        ``non_blocking`` and the host side is pinned, or device to device; a blocking
        copy is a host synchronization."""
        self._point()
        if dst.space != DEVICE and src.space != DEVICE:
            raise ValueError("copy between two host buffers: use host_write")
        host = dst if dst.space != DEVICE else (src if src.space != DEVICE else None)
        blocking = host is not None and not (non_blocking and host.space == PINNED)
        info = self._info(name or f"copy {src.name}->{dst.name}", True)
        if self.det is None:     # the declaration only feeds the detector
            table = None
        elif src.mem == dst.mem:
            table = {src.mem: [src, None, None]}
        else:
            table = {src.mem: [src, None, _EMPTY], dst.mem: [dst, _EMPTY, None]}
        self._raw_copy(dst, src, stream, blocking, info, table, self._clock(stream))
        if blocking:
            self.syncs += 1
            self._raw_sync_stream(stream, "a blocking host call")
            if self.det is not None:
                self.det.host_sync_stream(stream.ctx)

    # -- host accessors ----------------------------------------------------------------
    def to_host(self, buf: Buffer, stream: Stream):
        """A blocking device-to-host read of ``buf`` in ``stream`` order."""
        check_space(buf, (DEVICE,), "to_host")
        self._point()
        info = self._info(f"to_host {buf.name}", True)
        out = self._raw_to_host(buf, stream, info, {buf.mem: [buf, None, _EMPTY]},
                                self._clock(stream))
        self.syncs += 1
        self._raw_sync_stream(stream, "a blocking host call")
        if self.det is not None:
            self.det.host_sync_stream(stream.ctx)
        return out

    def host_view(self, buf: Buffer, rows=None):
        """The host reads a pinned or pageable buffer as it is now (a copy)."""
        self._point()
        return self._read_rows(buf, self._host_rows(buf, rows, False, "host_view"))

    def host_list(self, buf: Buffer, rows=None) -> list:
        """``host_view(buf, rows).tolist()``, the same host read, without the copy
        tensor: a whole buffer's values come from its numpy view (in a campaign, the
        torch copy cost about 7 µs a read, the numpy list one or two)."""
        self._point()
        r = self._host_rows(buf, rows, False, "host_view")
        if r is None:
            try:
                return self._host_array(buf.t).tolist()
            except (TypeError, RuntimeError):   # a dtype numpy lacks (bfloat16)
                pass
        return self._read_rows(buf, r).tolist()

    def host_write(self, buf: Buffer, values, rows=None) -> None:
        """The host writes a pinned or pageable buffer (all of it, or ``rows``)."""
        self._point()
        self._host_rows(buf, rows, True, "host_write")
        self._write_rows(buf, values, rows)

    # -- access feeding --------------------------------------------------------------
    @staticmethod
    def _declared(reads, writes):
        """The declaration as a table: memory id -> [buffer, rows read, rows written]
        (None: all rows; an empty set: none)."""
        if reads is None and writes is None:
            return None
        table: Dict[object, list] = {}
        get = table.get
        if reads:
            for x in reads:
                if type(x) is Region:
                    buf, rows = x.buffer, x.rows
                elif type(x) is Buffer:
                    buf, rows = x, None
                else:
                    reg = as_region(x)
                    buf, rows = reg.buffer, reg.rows
                ent = get(buf.mem)
                if ent is None:        # a new entry: these rows read, none written
                    table[buf.mem] = [buf, rows, _EMPTY]
                elif (cur := ent[1]) is not None:
                    ent[1] = None if rows is None else (cur | rows if cur else rows)
        if writes:
            for x in writes:
                if type(x) is Region:
                    buf, rows = x.buffer, x.rows
                elif type(x) is Buffer:
                    buf, rows = x, None
                else:
                    reg = as_region(x)
                    buf, rows = reg.buffer, reg.rows
                ent = get(buf.mem)
                if ent is None:        # a new entry: none read, these rows written
                    table[buf.mem] = [buf, _EMPTY, rows]
                elif (cur := ent[2]) is not None:
                    ent[2] = None if rows is None else (cur | rows if cur else rows)
        return table

    def _check_declared(self, acc: AccessSet, declared: dict, name: str) -> None:
        for mem, (buf, r, w) in acc.exact.items():
            ent = declared.get(mem)
            if ent is None:
                raise AnnotationError(f"launch '{name}' touched buffer '{buf.owner}', "
                                      f"which it did not declare")
            _, dr, dw = ent
            allowed_r = None if (dr is None or dw is None) else (dr | dw)
            read, written = acc.touched[mem]
            for kind, touched, used, allowed in (("wrote", written, w, dw),
                                                 ("read", read, r, allowed_r)):
                if not touched or allowed is None:
                    continue
                if not allowed:
                    raise AnnotationError(f"launch '{name}' {kind} '{buf.owner}', which it "
                                          f"declared only as {'read' if kind == 'wrote' else 'written'}")
                if used is None or not used <= allowed:
                    seen = "all rows" if used is None else sorted(used - allowed)
                    raise AnnotationError(
                        f"launch '{name}' {kind} '{buf.owner}' rows {seen} outside its "
                        f"annotation {sorted(allowed)}")

    def _prune(self, current) -> None:
        """Let the detector forget records every later access is ordered after: the
        clocks to come are at least the host's (stream work is enqueued under a join
        of it), the one of the work being checked (``current``) and those of queued
        work not yet checked (``_queued_clocks``)."""
        floor = list(self.det.clocks[0])
        for clock in (current, *self._queued_clocks()):
            for i in range(len(floor)):
                if i >= len(clock):
                    floor[i] = 0
                elif clock[i] < floor[i]:
                    floor[i] = clock[i]
        self.det.prune(floor)
        self._prune_at = self.det.accesses + _PRUNE_EVERY

    def _queued_clocks(self):
        """Clocks of device work queued and not yet checked (a backend that checks work
        when it runs, as the sim does, has some)."""
        return ()

    def _feed(self, ctx: int, clock, op: OpInfo, acc: Optional[AccessSet],
              declared: Optional[dict]) -> None:
        if self.det.accesses >= self._prune_at:
            self._prune(clock)
        raising = self.on_race == "raise"
        if acc is not None:
            items = []
            for buf, r, w in acc.items():
                ent = declared.get(buf.mem) if declared is not None else None
                if ent is not None:
                    dr, dw = ent[1], ent[2]
                    r = _narrow(r, None if (dr is None or dw is None) else dr | dw)
                    w = _narrow(w, dw)
                items.append((buf, r, w))
        else:
            items = declared.values()
        # each buffer's read, then its write, in one detector call (``access_all``)
        accesses = []
        for buf, r, w in items:
            if r is None or r:
                accesses.append((buf.mem, False, r))
            if w is None or w:
                accesses.append((buf.mem, True, w))
        rep = self.det.access_all(ctx, clock, op, accesses, raising)
        if rep is not None and raising:
            raise RaceError(rep)

    def _call(self, fn, args, kwargs):
        """Run device work that nothing intercepts: on a backend whose work is CPU tensor
        ops (``cpu_work``), a kernel's host run where it has one (``fn.host_run``: its one
        source, or a twin, on numpy views of its tensors, see ``device/xp.py``), held to
        the kernel (``device/twins.py``): a host run that raises is judged against the
        kernel on the tensors, never passed over, and ``twins="check"`` runs both and
        compares."""
        twin = getattr(fn, "host_run", None) if self.host_runs else None
        if twin is not None:
            get, host_array = self._arrays.get, self._host_array
            try:
                # a cached tensor is alive (the cache holds it), so no other object has
                # its id; only a tensor is looked up (a kernel's other arguments, ints
                # and models, are passed as they are)
                views = [(hit[1] if (hit := get(id(a))) is not None else host_array(a))
                         if type(a) is _Tensor or isinstance(a, _Tensor) else a
                         for a in args]
            except (TypeError, RuntimeError):   # a dtype numpy has no view of (bfloat16)
                return fn(*args, **kwargs)
            if self.check_twins:
                return check_twin(fn, twin, args, views, kwargs)
            try:
                return twin(*views, **kwargs)
            except Exception as e:  # noqa: BLE001 - judged against the kernel, never passed over
                return twin_failed(fn, args, kwargs, e)
        return fn(*args, **kwargs)

    def _host_array(self, t):
        """A numpy view of CPU tensor ``t`` (cached: long-lived buffers come back at
        every launch; the cache keeps ``t`` alive, so its id stays its own)."""
        hit = self._arrays.get(id(t))
        if hit is None:
            if len(self._arrays) >= 512:
                self._arrays.clear()
            hit = self._arrays[id(t)] = (t, t.numpy())
        return hit[1]

    def _run_closure(self, fn, args, kwargs, declared, ctx: int, clock, op: OpInfo):
        """Run ``fn`` (with interception when needed) and feed its accesses."""
        if self.det is None:
            return self._call(fn, args, kwargs)
        if declared is not None and (self.access == "declared"
                                     or (self.access == "audit" and not self._audits(op))):
            out = self._call(fn, args, kwargs)
            self._feed(ctx, clock, op, None, declared)
            return out
        mode = InferMode(self._by_storage, self.exact_rows)
        with mode:
            out = fn(*args, **kwargs)
        if declared is not None and self.access == "audit":
            self._audit(mode.acc, declared, ctx, op)
            self._feed(ctx, clock, op, None, declared)   # the declared mode's verdicts
            return out
        if mode.acc.hazards:
            raise DuplicateWriteError(f"launch '{op.name}': indexed write into "
                                      f"{mode.acc.hazards[0]}; its result depends on the "
                                      f"order duplicates land in (unspecified on CUDA)")
        if declared is not None:
            self._check_declared(mode.acc, declared, op.name)
        self._feed(ctx, clock, op, mode.acc, declared)
        return out

    def _audits(self, op: OpInfo) -> bool:
        """Is this launch of ``op.name`` audited? Its first ``AUDIT_FIRST`` launches of
        the run, then those counted 4, 16, 64, ... from 0 (in the order they run, which
        is the order they were issued in, one stream per name): a declaration wrong by
        construction shows at once, one wrong for some batches only is sampled at
        growing intervals, and a run costs the audit a handful of intercepted launches
        per kernel rather than all of them (an intercepted launch costs about ten times
        a plain one; the campaign audits a quarter of its examples)."""
        seen = self._audit_seen
        n = seen.get(op.name, 0)
        seen[op.name] = n + 1
        return n < AUDIT_FIRST or not (n & (n - 1) or n & 0xAAAAAAAAAAAAAAAA)

    def _audit(self, acc: AccessSet, declared: dict, ctx: int, op: OpInfo) -> None:
        """``access="audit"``: what the kernel touched outside its declaration, as
        reports among the detector's (``device/audit.py``)."""
        from .audit import undeclared
        name = next((s.name for s in self.streams if s.ctx == ctx), f"context {ctx}")
        self.det.reports.extend(undeclared(acc, declared, op, name))

    def _host_rows(self, buf: Buffer, rows, write: bool, what: str):
        """Check and record a host read or write of a pinned or pageable buffer."""
        check_space(buf, (PINNED, PAGEABLE), what)
        r = None if rows is None else frozenset(map(int, rows))
        if self.det is not None:
            self._host_access(buf, write, r, f"{what} {buf.name}")
        return r

    @staticmethod
    def _read_rows(buf: Buffer, r):
        return buf.t.clone() if r is None else buf.t[sorted(r)].clone()

    def _write_rows(self, buf: Buffer, values, rows) -> None:
        if rows is None and type(values) is _ndarray and buf.t.is_cpu:
            view = self._host_array(buf.t)
            if values.shape == view.shape and values.dtype == view.dtype:
                view[...] = values    # a host buffer's own memory: no tensor made of it
                return
        import torch
        vals = torch.as_tensor(values, dtype=buf.t.dtype)
        if rows is None:
            buf.t.copy_(vals.reshape(buf.t.shape) if vals.numel() == buf.t.numel() else vals)
        else:
            buf.t[list(rows)] = vals

    def _host_access(self, buf: Buffer, write: bool, rows, name: str) -> None:
        if self.det is not None:
            self._raise_on(self.det.access(0, buf.mem, write, rows, self._info(name, False, 5)))

    def graph_cache(self):
        """A ``device.graphs.GraphCache`` over the device buffers that exist now (the
        engine's long-lived ones); only where ``graphs`` is on."""
        raise RuntimeError(f"the {self.backend} runtime has no CUDA graphs")

    def new_flag(self, name: str):
        """A host flag device work can wait on (``host_flags`` backends only)."""
        raise RuntimeError(f"the {self.backend} runtime has no host flags")

    def wait_flag(self, stream: Stream, flag) -> None:
        raise RuntimeError(f"the {self.backend} runtime has no host flags")

    # -- backend hooks -----------------------------------------------------------------
    def _raw_stream(self, name):
        return None

    def _raw_event(self):
        return None

    def _raw_record_stream(self, buf, stream):
        pass

    def _raw_record(self, event: Event, stream: Stream, clock):
        """Record ``event`` on ``stream``; returns the handle ``event.last`` keeps."""
        raise NotImplementedError

    def _raw_wait(self, stream: Stream, event: Event, clock) -> None:
        raise NotImplementedError

    def _raw_query(self, event: Event) -> bool:
        raise NotImplementedError

    def _raw_sync_event(self, event: Event) -> None:
        raise NotImplementedError

    def _raw_sync_stream(self, stream: Stream, why: str) -> None:
        """Block the host until ``stream``'s queued work is done (``why``: the host
        call, for a report of a wait that can never complete)."""
        raise NotImplementedError

    def _raw_sync_all(self) -> None:
        raise NotImplementedError

    def _raw_launch(self, stream: Stream, fn, args, kwargs, info, declared, clock) -> None:
        """Queue (or run in stream order) ``fn``; with the detector on, its accesses go
        through ``_run_closure`` with ``clock``."""
        raise NotImplementedError

    def _raw_copy(self, dst: Buffer, src: Buffer, stream: Stream, blocking: bool,
                  info: OpInfo, table: dict, clock) -> None:
        raise NotImplementedError

    def _raw_to_host(self, buf: Buffer, stream: Stream, info: OpInfo, table: dict, clock):
        """Queue the copy of ``buf`` to a new host tensor and return that tensor (valid
        once the caller has synchronized ``stream``)."""
        raise NotImplementedError


def _narrow(inferred, declared):
    if declared is None:
        return inferred
    if inferred is None:
        return declared
    return inferred & declared


def check_space(buf: Buffer, spaces: Sequence[str], what: str) -> None:
    if buf.space not in spaces:
        raise ValueError(f"{what} needs a {' or '.join(spaces)} buffer, got {buf.owner} "
                         f"({buf.space})")
