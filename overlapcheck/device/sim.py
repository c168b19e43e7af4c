"""The simulated device: deterministic, on CPU tensors.

* Device work exists only as deferred closures queued on logical streams; arguments
  are bound at launch, tensor contents are read when the closure runs.
* Every host runtime call is a choice point: the strategy may retire some ready
  stream heads (FIFO per stream, event waits respected). Synchronizations retire
  exactly what they must, in an order the strategy picks.
* CUDA's rules: a wait binds to the latest ``record`` at the time of the wait, a wait
  on a never-recorded event is a no-op, ``query()`` on a never-recorded event is
  true; ``non_blocking`` copies are asynchronous only between device and pinned
  memory, other copies are synchronous.
* Fresh device and pinned buffers are poison-filled (the fill is a write by the
  allocating stream, or by the host for pinned memory: ``Runtime._fill``). A freed device buffer goes back
  to its allocation stream's pool and is handed, stale, to the next allocation of the
  same size on that stream; a buffer pledged to other streams with ``record_stream``
  is reused only once the host knows their work queued by the free is done.
* Every decision is recorded in ``rt.choices``; ``Replay(rt.choices)`` reruns exactly.
* Direct execution: work the host queues while nothing else is queued, where the
  strategy says (``Strategy.early_point``, which starts the next choice point ahead)
  that the next choice point retires it first, runs at once. That point would retire
  it before anything else, and between host runtime calls the host touches neither
  device memory nor the detector's clocks, so it runs on the same memory with the
  same clock and detector state. The decision that point records, and an exception
  the work raised, are settled at the next host call; a traced retire is stamped with
  that call. Choices, results, race reports and failures are the deferred run's.
  Work of a blocking call is not run so: the call's synchronization retires it.
"""
from __future__ import annotations

import sys
from array import array
from collections import deque
from math import prod as _prod
from typing import Deque, Dict, List, Optional, Tuple

import numpy as np
import torch

from ..race import OpInfo
from .api import _EMPTY, Event, Runtime, Stream, StuckWait
from .buffers import DEVICE, PAGEABLE, PINNED, Buffer, poison_value
from .sched import Strategy

KERNEL, RECORD, WAIT, COPY = "kernel", "record", "wait", "copy"
_dispatch_modes = torch._C._len_torch_dispatch_stack     # torch dispatch modes on now
_Size = torch.Size
_getframe = sys._getframe
# torch dtypes whose fresh buffers are made in numpy (the same values and layout)
_NP_DTYPES = {torch.int64: np.int64, torch.int32: np.int32, torch.int16: np.int16,
              torch.int8: np.int8, torch.uint8: np.uint8, torch.bool: np.bool_,
              torch.float64: np.float64, torch.float32: np.float32,
              torch.float16: np.float16}


class _Op:
    __slots__ = ("kind", "stream", "seq", "fn", "args", "kwargs", "clock", "info",
                 "declared", "bound", "retired")

    def __init__(self, kind, stream, seq, clock, info, fn, args, kwargs, declared, bound):
        self.kind, self.stream, self.seq = kind, stream, seq
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.clock, self.info, self.declared, self.bound = clock, info, declared, bound
        self.retired = False


class HostFlag:
    """A host-side flag that device work can wait on (``rt.wait_flag(stream, flag)``);
    ``flag.set()`` is the host action that releases it. It models a device wait on a
    later host action (a spin on pinned memory, a collective some rank has not joined):
    a host synchronization that needs work behind an unset flag raises ``StuckWait``
    instead of hanging. Sim only; it adds no happens-before edge of its own."""

    __slots__ = ("name", "retired", "stream", "seq")

    def __init__(self, name: str):
        self.name, self.retired, self.stream, self.seq = name, False, None, -1

    def set(self) -> None:
        self.retired = True

    def __repr__(self) -> str:
        return f"HostFlag({self.name}, {'set' if self.retired else 'unset'})"


class _Queue:
    __slots__ = ("ops", "enq", "ret", "known", "stream", "name", "ctx", "waits")

    def __init__(self, stream: Stream):
        self.ops: Deque[_Op] = deque()
        self.enq = 0     # ops enqueued so far
        self.ret = 0     # ops retired so far
        self.known = 0   # ops the host knows to be retired (through a synchronization)
        # retired waits not yet behind ``known``: (its seq, the stream it waited on, the
        # ops of that stream it waited for)
        self.waits: Deque[Tuple[int, int, int]] = deque()
        self.stream, self.name, self.ctx = stream, stream.name, stream.ctx


class SimRuntime(Runtime):
    backend = "sim"
    replayable = True
    host_flags = True
    cpu_work = True
    exact_rows = True

    def __init__(self, strategy: Strategy, detect: bool = True, access: str = "infer",
                 on_race: str = "collect"):
        super().__init__(detect=detect, access=access, on_race=on_race)
        self.strategy = strategy
        self.choices = array("H")    # decisions have few options: two bytes each
        self._q: Dict[int, _Queue] = {}
        self._queues: List[_Queue] = []     # in stream order (the order ``ready`` lists)
        self._opinfo: Dict[str, OpInfo] = {}   # record/wait op names -> their OpInfo
        self._pending = 0
        self._mem = 0
        # (stream ctx, numel, dtype) -> freed blocks: (the freed buffer's tensor, mem id,
        # pledges, storage address)
        self._pool: Dict[Tuple, List[Tuple[torch.Tensor, int, List[Tuple[int, int]], int]]] = {}
        self.calls = 0  # host runtime calls so far (the sim's logical clock)
        # with ``trace``: (stream, op name, host call at which it retired), in order
        self.retired: List[Tuple[str, str, int]] = []
        self.trace = False
        # direct execution (module doc): ``_owed``: work ran at once, whose decision the
        # next host call records, ``_owed_exc``: what that work raised; ``_started``:
        # the next choice point was started ahead (its work is queued, not run)
        # (not for a subclass that changes how work retires: its ``_retire`` must see
        # every op)
        self._early = bool(strategy.early) and type(self)._retire is SimRuntime._retire
        self._owed = False
        self._owed_exc: Optional[BaseException] = None
        self._started = False
        # ``launch`` and ``copy`` with the choice point's common case, ``_raw_launch`` /
        # ``_raw_copy`` and direct execution inlined (the most frequent host calls),
        # where a subclass changes none of those steps
        cls = type(self)
        self._inline = (cls._point is SimRuntime._point and cls._raw_launch is SimRuntime._raw_launch
                        and cls._raw_copy is SimRuntime._raw_copy
                        and cls._runs_now is SimRuntime._runs_now
                        and cls._ran_now is SimRuntime._ran_now
                        and cls._copy_fed is SimRuntime._copy_fed
                        and cls._raw_record is SimRuntime._raw_record
                        and cls._raw_wait is SimRuntime._raw_wait
                        and cls._enqueue is SimRuntime._enqueue and cls._now is SimRuntime._now
                        and cls._clock is Runtime._clock and cls._info is Runtime._info
                        and cls._op_info is Runtime._op_info)

    # -- choice points ---------------------------------------------------------------
    def _ready(self, limit: Optional[Dict[int, int]] = None) -> List[Stream]:
        return [q.stream for q in self._ready_queues(limit)]

    def _ready_queues(self, limit: Optional[Dict[int, int]] = None) -> List[_Queue]:
        """The queues whose head can retire (in stream order); with ``limit``, only those
        that have retired fewer than ``limit[ctx]`` ops."""
        out = []
        for q in self._queues:
            ops = q.ops
            if not ops:
                continue
            if limit is not None and q.ret >= limit.get(q.ctx, 0):
                continue
            head = ops[0]
            if head.kind == WAIT and not head.bound.retired:
                continue
            out.append(q)
        return out

    def _decide(self, n: int, ready: List[_Queue], forced: bool) -> int:
        c = self.strategy.choose(n, [q.name for q in ready], forced)
        if not 0 <= c < n:
            raise ValueError(f"strategy returned decision {c} of {n}")
        self.choices.append(c)
        return c

    def _point(self) -> None:
        """A choice point: the strategy may retire ready stream heads."""
        self.calls += 1
        if self._owed:       # work ran at once: this point retires it (``_now``)
            self._owed = False
            self.choices.append(1)
            if self._owed_exc is not None:
                self._settle_exc()
        if self._pending:
            self._point_rest()

    def _point_rest(self) -> None:
        """The rest of a choice point, with work queued: the strategy's decisions."""
        strategy = self.strategy
        if self._started:
            self._started = False
        else:
            strategy.new_point()
        choices, queues = self.choices, self._queues
        if strategy.eager():          # retire every ready head, first ready stream first
            # The streams before a ready one stay unready until a record retires (only
            # a record releases a wait here): the scan resumes where it was otherwise.
            i, n = 0, len(queues)
            while i < n:
                q = queues[i]
                ops = q.ops
                if ops:
                    head = ops[0]
                    kind = head.kind
                    if kind is not WAIT or head.bound.retired:
                        choices.append(1)
                        self._retire(q)
                        if not self._pending:
                            return
                        if kind is RECORD:
                            i = 0
                        continue
                i += 1
            return
        choose = strategy.choose
        ready = names = None
        while True:
            if ready is None:        # at the start, and after a record retired
                ready, names = [], []
                for q in queues:
                    ops = q.ops
                    if ops:
                        head = ops[0]
                        if head.kind != WAIT or head.bound.retired:
                            ready.append(q)
                            names.append(q.name)
            if not ready:
                return
            n = len(ready) + 1
            c = choose(n, names, False)
            if not 0 <= c < n:
                raise ValueError(f"strategy returned decision {c} of {n}")
            choices.append(c)
            if c == 0:
                return
            q = ready[c - 1]
            kind = q.ops[0].kind
            self._retire(q)
            if kind is RECORD:       # a record may release waits anywhere: scan again
                ready = None
            else:                    # only this stream's head changed
                ops = q.ops
                if not ops or (ops[0].kind == WAIT and not ops[0].bound.retired):
                    del ready[c - 1]
                    del names[c - 1]

    def launch(self, stream: Stream, fn, *args, name: Optional[str] = None, reads=None,
               writes=None, **kwargs) -> None:
        """``Runtime.launch``, with ``_point``'s start, ``_raw_launch`` and direct
        execution (``_runs_now``, ``_ran_now``) inlined: the same steps in the same order,
        three calls fewer (the most frequent host call; docs/design.md §8)."""
        if not self._inline:
            return Runtime.launch(self, stream, fn, *args, name=name, reads=reads,
                                  writes=writes, **kwargs)
        self.calls += 1                      # ``_point``
        if self._owed:
            self._owed = False
            self.choices.append(1)
            if self._owed_exc is not None:
                self._settle_exc()
        if self._pending:
            self._point_rest()
        self.launches += 1
        name = name or getattr(fn, "__name__", "kernel")
        det = self.det
        if det is None:
            info = self._op_info(name, "?", False)      # ``_info`` without a detector
            declared = clock = None
        else:
            f = _getframe(1)      # ``_info``'s lookup of the call site, inlined
            code = f.f_code
            hit = self._sites.get((name, id(code), f.f_lasti, False))
            info = hit[1] if hit is not None and hit[0] is code else self._info(name)
            declared = self._declared(reads, writes)
            clock = det.enqueue(stream.ctx)
        q = stream.raw                       # ``_raw_launch``
        if self._early and not self._pending:
            if self.strategy.early_point(q.name):    # ``_runs_now``: it runs now
                q.enq += 1
                q.ret += 1
                self._owed = True
                try:
                    self._run_closure(fn, args, kwargs, declared, q.ctx, clock, info)
                except Exception as e:  # noqa: BLE001 - raised where the deferred run raises it
                    self._owed_exc = e
                    return
                if self.trace:
                    self.retired.append((q.name, info.name, self.calls + 1))
                return
            self._started = True
        q.ops.append(_Op(KERNEL, stream, q.enq, clock, info, fn, args, kwargs, declared, None))
        q.enq += 1
        self._pending += 1

    def copy(self, dst: Buffer, src: Buffer, stream: Stream, non_blocking: bool = False,
             name: Optional[str] = None) -> None:
        """``Runtime.copy``, with ``_point``'s start, ``_raw_copy`` and direct execution
        inlined, as ``launch``."""
        if not self._inline:
            return Runtime.copy(self, dst, src, stream, non_blocking, name)
        self.calls += 1                      # ``_point``
        if self._owed:
            self._owed = False
            self.choices.append(1)
            if self._owed_exc is not None:
                self._settle_exc()
        if self._pending:
            self._point_rest()
        dspace, sspace = dst.space, src.space
        if dspace != DEVICE and sspace != DEVICE:
            raise ValueError("copy between two host buffers: use host_write")
        host = dst if dspace != DEVICE else (src if sspace != DEVICE else None)
        blocking = host is not None and not (non_blocking and host.space == PINNED)
        name = name or f"copy {src.name}->{dst.name}"
        det = self.det
        if det is None:     # the declaration only feeds the detector
            info = self._op_info(name, "?", True)       # ``_info`` without a detector
            table = clock = None
        else:
            f = _getframe(1)      # ``_info``'s lookup of the call site, inlined
            code = f.f_code
            hit = self._sites.get((name, id(code), f.f_lasti, True))
            info = hit[1] if hit is not None and hit[0] is code else self._info(name, True)
            if src.mem == dst.mem:
                table = {src.mem: [src, None, None]}
            else:
                table = {src.mem: [src, None, _EMPTY], dst.mem: [dst, _EMPTY, None]}
            clock = det.enqueue(stream.ctx)
        q = stream.raw                       # ``_raw_copy``
        if not blocking:
            if self._early and not self._pending:
                if self.strategy.early_point(q.name):    # ``_runs_now``: it runs now
                    q.enq += 1
                    q.ret += 1
                    self._owed = True
                    try:
                        self._copy(dst, src)
                        if det is not None:
                            self._feed(q.ctx, clock, info, None, table)
                    except Exception as e:  # noqa: BLE001 - raised where the deferred run raises it
                        self._owed_exc = e
                        return
                    if self.trace:
                        self.retired.append((q.name, info.name, self.calls + 1))
                    return
                self._started = True
        q.ops.append(_Op(COPY, stream, q.enq, clock, info, None, (dst, src), None, table, None))
        q.enq += 1
        self._pending += 1
        if blocking:
            self.syncs += 1
            self._raw_sync_stream(stream, "a blocking host call")
            if det is not None:
                det.host_sync_stream(stream.ctx)

    def _record(self, event: Event, stream: Stream) -> None:
        """``Runtime._record``, with ``_raw_record``, ``_enqueue`` and direct execution
        (``_now``: a record runs nothing) inlined, as ``launch``."""
        if not self._inline:
            return Runtime._record(self, event, stream)
        self._point()
        det = self.det
        clock = det.enqueue(stream.ctx) if det is not None else None
        q = stream.raw                       # ``_raw_record``, ``_enqueue``
        op = _Op(RECORD, stream, q.enq, clock, event.raw[0], None, (), None, None, None)
        q.enq += 1
        if self._early and not self._pending and self.strategy.early_point(q.name):
            q.ret += 1                       # ``_now``
            self._owed = True
            op.retired = True
            if self.trace:
                self.retired.append((q.name, op.info.name if op.info else RECORD, self.calls + 1))
        else:
            if self._early and not self._pending:
                self._started = True
            q.ops.append(op)
            self._pending += 1
        event.last = op
        if det is not None:
            det.record(stream.ctx, event.id)

    def _wait_event(self, stream: Stream, event: Event) -> None:
        """``Runtime._wait_event``, with ``_raw_wait`` and direct execution inlined, as
        ``launch``."""
        if not self._inline:
            return Runtime._wait_event(self, stream, event)
        self._point()
        rec = event.last
        if rec is None:
            return  # CUDA: waiting on a never-recorded event is a no-op
        det = self.det
        clock = det.enqueue(stream.ctx) if det is not None else None
        q, info = stream.raw, event.raw[1]   # ``_raw_wait``
        if rec.retired and self._early and not self._pending:
            if self.strategy.early_point(q.name):    # ``_runs_now``: it retires now
                q.enq += 1
                q.ret += 1
                self._owed = True
                if rec.stream is not None:
                    q.waits.append((q.enq - 1, rec.stream.ctx, rec.seq + 1))
                if self.trace:
                    self.retired.append((q.name, info.name, self.calls + 1))
                if det is not None:
                    det.wait(stream.ctx, event.id)
                return
            self._started = True
        q.ops.append(_Op(WAIT, stream, q.enq, clock, info, None, (), None, None, rec))
        q.enq += 1
        self._pending += 1
        if det is not None:
            det.wait(stream.ctx, event.id)

    def _settle_exc(self) -> None:
        """The choice point after work ran at once retires that work, the only work
        queued (decision 1: ``_point`` records it), and the work's exception comes out
        here."""
        exc, self._owed_exc = self._owed_exc, None
        raise exc

    def _now(self, q: _Queue, op: _Op) -> None:
        """Retire ``op`` (just queued on ``q``, nothing else queued) at once: direct
        execution (module doc); ``_retire`` as the next choice point would run it."""
        q.ret += 1
        self._owed = True
        kind = op.kind
        try:
            if kind is KERNEL:
                self._run_closure(op.fn, op.args, op.kwargs or {}, op.declared, q.ctx,
                                  op.clock, op.info)
            elif kind is COPY:
                self._copy(*op.args)
                if self.det is not None:
                    self._feed(q.ctx, op.clock, op.info, None, op.declared)
            elif kind is WAIT and op.bound.stream is not None:
                q.waits.append((op.seq, op.bound.stream.ctx, op.bound.seq + 1))
        except Exception as e:  # noqa: BLE001 - raised where the deferred run raises it
            self._owed_exc = e
            return
        op.retired = True
        if self.trace:
            self.retired.append((q.name, op.info.name if op.info else kind, self.calls + 1))

    def host_choice(self, names) -> int:
        """A host thread switch (docs/design.md §4.14): a choice point for the device
        work too, then, with several threads runnable, a forced decision of the
        strategy over their names, recorded with the device's."""
        self._point()
        n = len(names)
        if n == 1:
            return 0
        c = self.strategy.choose(n, list(names), True)
        if not 0 <= c < n:
            raise ValueError(f"strategy returned decision {c} of {n}")
        self.choices.append(c)
        return c

    def _drain(self, need: Dict[int, int], why: str = "a blocking host call") -> None:
        """Retire exactly what must retire for every stream ``ctx`` to have retired its
        first ``need[ctx]`` ops, including what those ops wait for. Raises
        ``StuckWait`` when that needs an unset host flag (``why``: the host wait)."""
        changed = True
        while changed:
            changed = False
            for ctx, upto in list(need.items()):
                q = self._q[ctx]
                for op in q.ops:
                    if op.seq >= upto:
                        break
                    if op.kind == WAIT and not op.bound.retired:
                        b = op.bound
                        if b.stream is None:
                            raise StuckWait(why, op.stream.name, b.name)
                        if need.get(b.stream.ctx, 0) < b.seq + 1:
                            need[b.stream.ctx] = b.seq + 1
                            changed = True
        while True:
            ready = self._ready_queues(need)
            if not ready:
                break
            if len(ready) == 1:
                c = 0
            elif self.strategy.eager():
                c = 0
                self.choices.append(0)
            else:
                c = self._decide(len(ready), ready, True)
            self._retire(ready[c])
        for ctx, upto in need.items():
            assert self._q[ctx].ret >= upto, "the sim could not retire what a synchronization needs"
            self._learn(ctx, upto)

    def _learn(self, ctx: int, upto: int) -> None:
        """The host knows stream ``ctx`` retired its first ``upto`` ops, and so, through
        the waits among them, the work of the streams they waited for."""
        todo = [(ctx, upto)]
        while todo:
            ctx, upto = todo.pop()
            q = self._q[ctx]
            if upto <= q.known:
                continue
            q.known = upto
            waits = q.waits
            while waits and waits[0][0] < upto:
                _, other, n = waits.popleft()
                todo.append((other, n))

    def _retire(self, q: _Queue) -> None:
        op = q.ops.popleft()
        q.ret += 1
        self._pending -= 1
        kind = op.kind
        if kind == KERNEL:
            self._run_closure(op.fn, op.args, op.kwargs or {}, op.declared, q.ctx, op.clock,
                              op.info)
        elif kind == COPY:
            self._copy(*op.args)
            if self.det is not None:
                self._feed(q.ctx, op.clock, op.info, None, op.declared)
        elif kind == WAIT and op.bound.stream is not None:
            q.waits.append((op.seq, op.bound.stream.ctx, op.bound.seq + 1))
        op.retired = True
        if self.trace:
            self.retired.append((q.name, op.info.name if op.info else kind, self.calls))

    def _copy(self, dst: Buffer, src: Buffer) -> None:
        """``dst.t.copy_(src.t)``; between the numpy views of both (a few times cheaper
        on small buffers) where both are known and alike in shape and dtype, and no
        torch dispatch mode is on (one observes torch's ops: it sees torch's copy)."""
        arrays = self._arrays
        d, s = arrays.get(id(dst.t)), arrays.get(id(src.t))
        if d is not None and s is not None and not _dispatch_modes():
            dv, sv = d[1], s[1]
            if dv.shape == sv.shape and dv.dtype == sv.dtype:
                dv[...] = sv
                return
        dst.t.copy_(src.t)

    def _queued_clocks(self):
        for q in self._queues:
            for op in q.ops:
                if op.kind == KERNEL or op.kind == COPY:
                    yield op.clock

    def _enqueue(self, s: Stream, kind: str, clock, info, fn=None, args=(), kwargs=None,
                 declared=None, bound=None, blocking: bool = False) -> _Op:
        """Queue an op; run it at once where direct execution may (module doc)."""
        q = s.raw
        op = _Op(kind, s, q.enq, clock, info, fn, args, kwargs, declared, bound)
        q.enq += 1
        if (self._early and not self._pending and not blocking
                and (kind is not WAIT or bound.retired)):
            if self.strategy.early_point(q.name):
                self._now(q, op)
                return op
            self._started = True
        q.ops.append(op)
        self._pending += 1
        return op

    def _named(self, name: str) -> OpInfo:
        info = self._opinfo.get(name)
        if info is None:
            info = self._opinfo[name] = OpInfo(name)
        return info

    # -- streams and events ------------------------------------------------------------
    def new_stream(self, name: str) -> Stream:
        s = super().new_stream(name)
        q = self._q[s.ctx] = s.raw = _Queue(s)     # the sim's stream handle: its queue
        self._queues.append(q)
        return s

    def new_event(self, name: str = "event") -> Event:
        ev = super().new_event(name)
        ev.raw = (self._named(f"record {name}"), self._named(f"wait {name}"))  # its ops' infos
        return ev

    def _raw_record(self, event: Event, stream: Stream, clock) -> _Op:
        return self._enqueue(stream, RECORD, clock, event.raw[0])

    def _raw_wait(self, stream: Stream, event: Event, clock) -> None:
        q, rec, info = stream.raw, event.last, event.raw[1]
        if rec.retired and self._runs_now(q):       # ``_now`` of the wait, no op made
            if rec.stream is not None:
                q.waits.append((q.enq - 1, rec.stream.ctx, rec.seq + 1))
            if self.trace:
                self.retired.append((q.name, info.name, self.calls + 1))
            return
        q.ops.append(_Op(WAIT, stream, q.enq, clock, info, None, (), None, None, rec))
        q.enq += 1
        self._pending += 1

    def _raw_query(self, event: Event) -> bool:
        rec = event.last
        if not rec.retired:
            return False
        q = self._q[rec.stream.ctx]
        self._learn(rec.stream.ctx, rec.seq + 1)
        return True

    def _raw_sync_event(self, event: Event) -> None:
        rec = event.last
        self._drain({rec.stream.ctx: rec.seq + 1}, f"host synchronize on event '{event.name}'")

    def _raw_sync_stream(self, stream: Stream, why: str) -> None:
        self._drain({stream.ctx: self._q[stream.ctx].enq}, why)

    def _raw_sync_all(self) -> None:
        self._drain({s.ctx: self._q[s.ctx].enq for s in self.streams}, "host device synchronize")

    def new_flag(self, name: str) -> HostFlag:
        """A host flag, unset (see ``HostFlag``)."""
        return HostFlag(name)

    def wait_flag(self, stream: Stream, flag: HostFlag) -> None:
        """``stream``'s later work waits until the host sets ``flag``."""
        self._point()
        if not flag.retired:
            self._enqueue(stream, WAIT, self._clock(stream), OpInfo(f"wait {flag.name}"),
                          bound=flag)

    # -- buffers ---------------------------------------------------------------------
    def _fresh(self, shape, dtype, space: str) -> Tuple[torch.Tensor, int]:
        self._mem += 1
        np_dtype = _NP_DTYPES.get(dtype)
        if np_dtype is None:     # no numpy twin of the dtype (bfloat16)
            return torch.full(tuple(shape), poison_value(dtype), dtype=dtype), self._mem
        # numpy's memory, filled there: torch.full and then the host twins' numpy view
        # (Tensor.numpy) cost about twice this, and the view is known from the start
        a = np.empty(shape, dtype=np_dtype)
        a.fill(poison_value(dtype))
        t = torch.from_numpy(a)
        arrays = self._arrays
        if len(arrays) >= 512:
            arrays.clear()
        arrays[id(t)] = (t, a)
        return t, self._mem

    def empty(self, shape, dtype, name: str, stream: Stream) -> Buffer:
        """A device buffer allocated on ``stream`` (poison-filled when fresh, stale when
        the allocator hands back a freed block)."""
        self._point()
        # a torch.Size holds ints already (most calls pass a buffer's shape)
        shape = tuple(shape) if type(shape) is _Size else tuple(map(int, shape))
        got = self._reuse((stream.ctx, _prod(shape), dtype), shape)
        if got is None:
            t, mem = self._fresh(shape, dtype, DEVICE)
            ptr = None
        else:
            t, mem, ptr = got
        self._serial += 1
        buf = self._register(Buffer(name, t, DEVICE, mem, self._serial, stream), ptr)
        if got is None and self.det is not None:
            self._fill(buf, stream)      # the poison fill: the allocating stream's write
        return buf

    def _reuse(self, key, shape):
        """A freed block of ``key`` (stream, elements, dtype) the host may hand out now
        (every stream it was promised to is known to be past the free), the most recently
        freed first: (tensor, memory id, storage address), or None."""
        blocks = self._pool.get(key)
        if blocks:
            qs = self._q
            for i in range(len(blocks) - 1, -1, -1):
                old, m, pledges, p = blocks[i]
                for ctx, upto in pledges:
                    if qs[ctx].known < upto:
                        break
                else:
                    del blocks[i]
                    # the freed buffer's own tensor when the shape is the same (closures
                    # never change a tensor's shape, so it is as good as a new view, and
                    # the host twins' array cache knows it)
                    return (old if old.shape == shape else old.view(shape)), m, p
        return None

    def host_empty(self, shape, dtype, name: str, pinned: bool = True) -> Buffer:
        self._point()
        t, mem = self._fresh(shape, dtype, PINNED if pinned else PAGEABLE)
        buf = self._register(Buffer(name, t, PINNED if pinned else PAGEABLE, mem,
                                    self._next_serial()))
        if self.det is not None:
            self._fill(buf)              # the poison fill: the host's write
        return buf

    def free(self, buf: Buffer) -> None:
        """Give ``buf`` back: device memory to its stream's pool (reused by a later
        allocation on that stream), host memory for good. Not an access."""
        self._point()
        # Queued closures may still touch the memory: keep it attributable.
        self._unregister(buf, keep_lookup=True)
        if buf.space == DEVICE:
            t = buf.t
            key = (buf.stream.ctx, t.numel(), t.dtype)
            pledges = [(s.ctx, self._q[s.ctx].enq) for s in buf.pledged]
            blocks = self._pool.get(key)
            if blocks is None:
                blocks = self._pool[key] = []
            blocks.append((t, buf.mem, pledges, buf.ptr))

    # -- device work -------------------------------------------------------------------
    def _raw_launch(self, stream: Stream, fn, args, kwargs, info, declared, clock) -> None:
        """Queue ``fn``; it runs when the stream retires it (``_enqueue``, inlined: the
        most frequent op)."""
        q = stream.raw
        if self._runs_now(q):                     # ``_now`` of the kernel, no op made
            return self._ran_now(q, info, self._run_closure, fn, args, kwargs, declared,
                                 q.ctx, clock, info)
        q.ops.append(_Op(KERNEL, stream, q.enq, clock, info, fn, args, kwargs, declared, None))
        q.enq += 1
        self._pending += 1

    def _raw_copy(self, dst: Buffer, src: Buffer, stream: Stream, blocking: bool,
                  info: OpInfo, table: dict, clock) -> None:
        q = stream.raw
        if not blocking and self._runs_now(q):    # ``_now`` of the copy, no op made
            return self._ran_now(q, info, self._copy_fed, dst, src, q.ctx, clock, info, table)
        q.ops.append(_Op(COPY, stream, q.enq, clock, info, None, (dst, src), None, table, None))
        q.enq += 1
        self._pending += 1

    def _runs_now(self, q: _Queue) -> bool:
        """Direct execution (module doc) of work the host queues on ``q`` now, without
        an op: whether nothing else is queued and the next choice point (started here)
        retires it first; if so the work counts as queued and retired, and the next
        host call records that decision (``_owed``). Otherwise the caller queues the
        work itself (not through ``_enqueue``: the point is started)."""
        if not self._early or self._pending:
            return False
        if not self.strategy.early_point(q.name):
            self._started = True
            return False
        q.enq += 1
        q.ret += 1
        self._owed = True
        return True

    def _ran_now(self, q: _Queue, info: OpInfo, work, *args) -> None:
        """Direct execution's run of ``work(*args)`` (``_runs_now`` said yes): an
        exception is kept (``_owed_exc``) and raised where the deferred run raises it;
        the trace records the retire under the next host call."""
        try:
            work(*args)
        except Exception as e:  # noqa: BLE001 - raised where the deferred run raises it
            self._owed_exc = e
            return
        if self.trace:
            self.retired.append((q.name, info.name, self.calls + 1))

    def _copy_fed(self, dst: Buffer, src: Buffer, ctx, clock, info: OpInfo, table: dict) -> None:
        self._copy(dst, src)
        if self.det is not None:
            self._feed(ctx, clock, info, None, table)

    def _raw_to_host(self, buf: Buffer, stream: Stream, info: OpInfo, table: dict, clock):
        out = torch.empty_like(buf.t)
        self._enqueue(stream, KERNEL, clock, info, out.copy_, (buf.t,), None, table, None,
                      True)
        return out


class StraightRuntime(SimRuntime):
    """The sim under the eager schedule with no detector and no trace, run straight
    through: parity's reference run (docs/design.md §6.4). There, every op the host
    queues runs at its host call, in the order the host queues it: direct execution
    runs a launch, a non-blocking copy, a record and a wait on a recorded event at once
    (the eager strategy retires all of it at the next choice point), and a blocking
    copy or a read to the host is retired by its own synchronization. So no choice
    point of that run ever finds work queued: it decides nothing but the decision it
    owes. What is left of the sim, and what this runtime keeps, is:

    * the order of the work and the values it computes (each op runs at its call);
    * ``syncs`` and ``launches``, counted as the sim counts them;
    * a closure's exception, raised at the next host call (the sim's owed decision);
    * the allocator: a freed block goes back to its stream's pool and is handed, with
      its old contents, to the next allocation that matches, once the host knows the
      streams pledged to it finished the work queued by the free. The knowledge comes
      from the same places (synchronizations, queries, the waits between streams), so
      every allocation gets the block the sim would give it.

    It records no choices (``replayable`` is off: a run of it has none to replay), no
    trace, and has no host flags (the reference config runs one rank). A test runs it
    against the plain sim under the eager schedule on the fuzzer's cases
    (``tests/test_sim.py``)."""

    replayable = False
    host_flags = False

    def __init__(self):
        from .sched import Eager
        super().__init__(Eager(), detect=False, access="declared")

    def _point(self) -> None:
        """A host call: the exception of work run at its call comes out here."""
        if self._owed_exc is not None:
            self._settle_exc()

    def launch(self, stream: Stream, fn, *args, name: Optional[str] = None, reads=None,
               writes=None, **kwargs) -> None:
        if self._owed_exc is not None:
            self._settle_exc()
        self.launches += 1
        stream.raw.enq += 1
        try:
            self._call(fn, args, kwargs)
        except Exception as e:  # noqa: BLE001 - raised at the next host call, as the sim does
            self._owed_exc = e

    def copy(self, dst: Buffer, src: Buffer, stream: Stream, non_blocking: bool = False,
             name: Optional[str] = None) -> None:
        if self._owed_exc is not None:
            self._settle_exc()
        dspace, sspace = dst.space, src.space
        if dspace != DEVICE and sspace != DEVICE:
            raise ValueError("copy between two host buffers: use host_write")
        host = dst if dspace != DEVICE else (src if sspace != DEVICE else None)
        q = stream.raw
        q.enq += 1
        if host is not None and not (non_blocking and host.space == PINNED):   # blocking
            self.syncs += 1
            self._copy(dst, src)
            self._learn(q.ctx, q.enq)
            return
        try:
            self._copy(dst, src)
        except Exception as e:  # noqa: BLE001 - raised at the next host call, as the sim does
            self._owed_exc = e

    def to_host(self, buf: Buffer, stream: Stream):
        from .api import check_space
        check_space(buf, (DEVICE,), "to_host")
        if self._owed_exc is not None:
            self._settle_exc()
        q = stream.raw
        q.enq += 1
        out = torch.empty_like(buf.t)
        self.syncs += 1
        out.copy_(buf.t)
        self._learn(q.ctx, q.enq)
        return out

    # a record is kept as (its stream's ctx, that stream's ops up to and including it)
    def _record(self, event: Event, stream: Stream) -> None:
        if self._owed_exc is not None:
            self._settle_exc()
        q = stream.raw
        q.enq += 1
        event.last = (q.ctx, q.enq)

    def _wait_event(self, stream: Stream, event: Event) -> None:
        if self._owed_exc is not None:
            self._settle_exc()
        rec = event.last
        if rec is None:
            return  # CUDA: waiting on a never-recorded event is a no-op
        q = stream.raw
        q.waits.append((q.enq, rec[0], rec[1]))
        q.enq += 1

    def _query(self, event: Event) -> bool:
        if self._owed_exc is not None:
            self._settle_exc()
        rec = event.last
        if rec is not None:
            self._learn(rec[0], rec[1])
        return True

    def _sync_event(self, event: Event) -> None:
        if self._owed_exc is not None:
            self._settle_exc()
        self.syncs += 1
        rec = event.last
        if rec is not None:
            self._learn(rec[0], rec[1])

    def _sync_stream(self, stream: Stream) -> None:
        if self._owed_exc is not None:
            self._settle_exc()
        self.syncs += 1
        q = stream.raw
        self._learn(q.ctx, q.enq)

    def synchronize(self) -> None:
        if self._owed_exc is not None:
            self._settle_exc()
        self.syncs += 1
        for s in self.streams:
            self._learn(s.ctx, s.raw.enq)

    def _register(self, buf: Buffer, ptr=None) -> Buffer:
        """Counted live, without its storage address: only the detector's access
        inference and CUDA graphs look buffers up by it. ``SimRuntime.empty`` and
        ``free`` then hand out and take back the sim's blocks as they are."""
        live = self._live
        live[buf.name] = live.get(buf.name, 0) + 1
        return buf

    def host_list(self, buf: Buffer, rows=None) -> list:
        if self._owed_exc is not None:
            self._settle_exc()
        if buf.space != PINNED and buf.space != PAGEABLE:
            from .api import check_space
            check_space(buf, (PINNED, PAGEABLE), "host_view")
        if rows is None:
            try:
                return self._host_array(buf.t).tolist()
            except (TypeError, RuntimeError):   # a dtype numpy lacks (bfloat16)
                pass
            return self._read_rows(buf, None).tolist()
        return self._read_rows(buf, frozenset(map(int, rows))).tolist()

    def host_write(self, buf: Buffer, values, rows=None) -> None:
        if self._owed_exc is not None:
            self._settle_exc()
        if buf.space != PINNED and buf.space != PAGEABLE:
            from .api import check_space
            check_space(buf, (PINNED, PAGEABLE), "host_write")
        if rows is not None:
            frozenset(map(int, rows))       # rows the sim takes (its error for one it cannot)
        self._write_rows(buf, values, rows)

    def host_choice(self, names) -> int:
        """The eager schedule's forced decision: the first runnable thread."""
        if self._owed_exc is not None:
            self._settle_exc()
        return 0

    def new_flag(self, name: str):
        raise RuntimeError("the straight runtime has no host flags")

    def wait_flag(self, stream: Stream, flag) -> None:
        raise RuntimeError("the straight runtime has no host flags")
