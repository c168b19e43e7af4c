"""Small device programs, run on the sim, and exhaustive enumeration of their schedules.

A ``Program`` is straight-line host code against the runtime API: kernel launches that
read cells and write one unique value into one cell, host reads and writes of host
buffers, copies, events, stream waits, synchronizations, frees, re-allocations and
``record_stream``. ``run_program`` interprets it on a ``SimRuntime`` and returns its
*outcome*: every value any operation observed, keyed by instruction, never by time:

* what each kernel read, and the prior contents of the cell it overwrote;
* the prior contents of every cell a copy or a host write overwrote (seen by a
  ``TorchDispatchMode`` outside the runtime's, so the detector sees nothing of it);
* every ``host_view`` / ``to_host`` result, and the final contents of every memory
  block ever allocated.

Observing the overwritten contents makes write-write races observable. With unique
written values, a race changes the outcome unless a copy writes a value the cell already
holds (a *silent* store): ``Run.silent`` names the instructions that made one.
``enumerate_schedules`` walks the whole schedule tree depth-first with ``Script``.

``python -m overlapcheck.device.explore SEED`` runs ``demo_program()`` under the
``random`` strategy seeded by ``SEED`` and prints its choices and outcome as JSON.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Tuple, Union

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .. import seeds
from .api import is_fill
from .buffers import DEVICE, PAGEABLE, PINNED
from .sched import Script, Strategy, make_strategy
from .sim import SimRuntime

Cell = Tuple[int, int]  # (buffer variable, row)


@dataclass(frozen=True)
class Buf:
    """A buffer variable: its memory space, rows, and (device) allocation stream."""
    space: str
    rows: int = 1
    stream: int = 0


@dataclass(frozen=True)
class Launch:
    stream: int
    reads: Tuple[Cell, ...]
    write: Optional[Cell]
    value: int


@dataclass(frozen=True)
class HostWrite:
    buf: int
    row: int
    value: int


@dataclass(frozen=True)
class HostView:
    buf: int
    row: Optional[int] = None  # None: the whole buffer


@dataclass(frozen=True)
class Copy:
    dst: int
    src: int
    stream: int
    non_blocking: bool


@dataclass(frozen=True)
class ToHost:
    buf: int
    stream: int


@dataclass(frozen=True)
class Record:
    event: int
    stream: int


@dataclass(frozen=True)
class WaitEvent:
    stream: int
    event: int


@dataclass(frozen=True)
class WaitStream:
    stream: int
    other: int


@dataclass(frozen=True)
class SyncStream:
    stream: int


@dataclass(frozen=True)
class SyncEvent:
    event: int


@dataclass(frozen=True)
class SyncDevice:
    pass


@dataclass(frozen=True)
class Free:
    buf: int


@dataclass(frozen=True)
class Alloc:
    """Re-allocate a freed buffer variable (same shape); device memory on ``stream``."""
    buf: int
    stream: int = 0


@dataclass(frozen=True)
class RecordStream:
    buf: int
    stream: int


Instr = Union[Launch, HostWrite, HostView, Copy, ToHost, Record, WaitEvent, WaitStream,
              SyncStream, SyncEvent, SyncDevice, Free, Alloc, RecordStream]


@dataclass(frozen=True)
class Program:
    """Buffers are allocated in order first (device ones on ``Buf.stream``), then
    ``body`` runs, then the host synchronizes the device and the outcome is read."""
    streams: int
    events: int
    buffers: Tuple[Buf, ...]
    body: Tuple[Instr, ...]

    def __str__(self) -> str:
        lines = [f"Program(streams={self.streams}, events={self.events})"]
        lines += [f"  b{i} = {b}" for i, b in enumerate(self.buffers)]
        lines += [f"  {k}: {ins}" for k, ins in enumerate(self.body)]
        return "\n".join(lines)


Outcome = Tuple[Tuple[tuple, tuple], ...]


@dataclass
class Run:
    """One run of a program: its outcome, the detector's verdict, and the choices."""
    outcome: Outcome
    flagged: bool
    reports: list
    choices: List[int]
    silent: frozenset = frozenset()  # instructions that wrote a value the cell held
    strategy: Optional[Strategy] = field(default=None, repr=False)

    def __iter__(self):
        return iter((self.outcome, self.flagged, self.reports, self.choices))


class _Observer(TorchDispatchMode):
    """Sees every write to a tracked storage that is not a kernel's (those record
    themselves): a retiring copy (source tracked) or the current host instruction."""

    def __init__(self, state: "_State"):
        super().__init__()
        self.state = state

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        st = self.state
        if not st.in_kernel and not func.is_view:
            for i, a in enumerate(func._schema.arguments):
                if a.alias_info is None or not a.alias_info.is_write:
                    continue
                v = args[i] if i < len(args) else kwargs.get(a.name)
                mem = st.mem_of(v)
                if mem is not None:
                    src = st.mem_of(args[1]) if len(args) > 1 else None
                    st.note_write(mem, src is not None, args[1] if src is not None else None)
        return func(*args, **kwargs)


class _State:
    def __init__(self, rt: SimRuntime):
        self.rt = rt
        self.in_kernel = False
        self.host = -1
        self.by_ptr: Dict[int, object] = {}
        self.tensor: Dict[object, torch.Tensor] = {}
        self.obs: Dict[tuple, tuple] = {}
        self.copies: List[Tuple[int, tuple, bool]] = []
        self.silent: set = set()

    def track(self, buf) -> None:
        self.by_ptr[buf.t.untyped_storage().data_ptr()] = buf.mem
        self.tensor[buf.mem] = buf.t

    def mem_of(self, v) -> object:
        if isinstance(v, torch.Tensor):
            return self.by_ptr.get(v.untyped_storage().data_ptr())
        return None

    def note_write(self, mem, is_copy: bool, src: Optional[torch.Tensor]) -> None:
        prior = tuple(self.tensor[mem].tolist())
        if is_copy:
            new = tuple(src.tolist())
            self.copies.append((len(self.rt.retired), prior,
                                any(p == n for p, n in zip(prior, new))))
        else:
            self.obs[(self.host, "prior")] = prior


def _kernel(st: _State, k: int, reads, write, value: int):
    def run():
        st.in_kernel = True
        try:
            got = tuple(b.t[r].clone().tolist() for b, r in reads)
            if write is not None:
                b, r = write
                prior = b.t.tolist()[r]         # .tolist(): invisible to the detector
                if prior == value:
                    st.silent.add(k)
                b.t[r].fill_(value)
                st.obs[(k, "prior")] = (prior,)
            st.obs[(k, "read")] = got
        finally:
            st.in_kernel = False
    return run


def run_program(program: Program, strategy: Strategy) -> Run:
    """Interpret ``program`` on a fresh ``SimRuntime`` driven by ``strategy``."""
    rt = SimRuntime(strategy)
    rt.trace = True
    st = _State(rt)
    streams = [rt.new_stream(f"s{i}") for i in range(program.streams)]
    events = [rt.new_event(f"e{i}") for i in range(program.events)]
    bufs: list = [None] * len(program.buffers)

    def alloc(i: int, stream: int) -> None:
        d = program.buffers[i]
        if d.space == DEVICE:
            b = rt.empty((d.rows,), torch.int64, f"b{i}", streams[stream])
        else:
            b = rt.host_empty((d.rows,), torch.int64, f"b{i}", pinned=d.space == PINNED)
        st.track(b)
        bufs[i] = b

    with _Observer(st):
        for i, d in enumerate(program.buffers):
            alloc(i, d.stream)
        for k, ins in enumerate(program.body):
            st.host = k
            _step(rt, st, k, ins, streams, events, bufs, alloc)
        st.host = -1
        rt.synchronize()
    for idx, prior, silent in st.copies:
        k = int(rt.retired[idx][1][1:])
        st.obs[(k, "prior")] = prior
        if silent:
            st.silent.add(k)
    for mem, t in st.tensor.items():
        st.obs[("final", mem)] = tuple(t.tolist())
    outcome = tuple(sorted(st.obs.items(), key=lambda kv: repr(kv[0])))
    # an allocation's poison fill: the sim fills fresh memory at the allocation, as the
    # host, where a GPU queues the fill on the allocating stream (``Runtime._fill``); no
    # schedule of the sim can show that order, so the enumeration leaves fill reports out
    reports = [r for r in rt.reports if not (is_fill(r.current.op) or is_fill(r.previous.op))]
    return Run(outcome, bool(reports), reports, list(rt.choices), frozenset(st.silent), strategy)


def _step(rt, st, k, ins, streams, events, bufs, alloc) -> None:
    t = type(ins)
    if t is Launch:
        reads = tuple((bufs[b], r) for b, r in ins.reads)
        write = None if ins.write is None else (bufs[ins.write[0]], ins.write[1])
        rt.launch(streams[ins.stream], _kernel(st, k, reads, write, ins.value), name=f"i{k}")
    elif t is HostWrite:
        rt.host_write(bufs[ins.buf], [ins.value], rows=[ins.row])
        st.obs[(k, "prior")] = (st.obs[(k, "prior")][ins.row],)
    elif t is HostView:
        rows = None if ins.row is None else [ins.row]
        st.obs[(k, "view")] = tuple(rt.host_view(bufs[ins.buf], rows).tolist())
    elif t is Copy:
        rt.copy(bufs[ins.dst], bufs[ins.src], streams[ins.stream],
                non_blocking=ins.non_blocking, name=f"i{k}")
    elif t is ToHost:
        st.obs[(k, "view")] = tuple(rt.to_host(bufs[ins.buf], streams[ins.stream]).tolist())
    elif t is Record:
        events[ins.event].record(streams[ins.stream])
    elif t is WaitEvent:
        streams[ins.stream].wait_event(events[ins.event])
    elif t is WaitStream:
        streams[ins.stream].wait_stream(streams[ins.other])
    elif t is SyncStream:
        streams[ins.stream].synchronize()
    elif t is SyncEvent:
        events[ins.event].synchronize()
    elif t is SyncDevice:
        rt.synchronize()
    elif t is Free:
        rt.free(bufs[ins.buf])
    elif t is Alloc:
        alloc(ins.buf, ins.stream)
    elif t is RecordStream:
        rt.record_stream(bufs[ins.buf], streams[ins.stream])
    else:
        raise TypeError(f"unknown instruction {ins!r}")


class ScheduleLimit(Exception):
    """The program has more schedules than the enumeration's limit."""


def enumerate_schedules(program: Program, limit: Optional[int] = None) -> Iterator[Run]:
    """Run ``program`` once per schedule, depth-first over decision prefixes: after a
    run, the deepest decision with options left is incremented and the rest dropped.
    Raises ``ScheduleLimit`` after ``limit`` runs when schedules remain."""
    prefix: List[int] = []
    count = 0
    while True:
        strategy = Script(prefix)
        yield run_program(program, strategy)
        count += 1
        taken, options = strategy.taken, strategy.options
        i = len(taken) - 1
        while i >= 0 and taken[i] + 1 >= options[i]:
            i -= 1
        if i < 0:
            return
        if limit is not None and count >= limit:
            raise ScheduleLimit(f"more than {limit} schedules")
        prefix = taken[:i] + [taken[i] + 1]


def demo_program() -> Program:
    """A fixed two-stream program with an event, a free and re-allocation, and a host
    read of a non-blocking copy's pinned destination without waiting (a race)."""
    return Program(
        streams=2, events=1,
        buffers=(Buf(DEVICE, 2, 0), Buf(DEVICE, 1, 1), Buf(PINNED, 2), Buf(PAGEABLE, 1)),
        body=(Launch(0, (), (0, 0), 100), Launch(0, ((0, 0),), (0, 1), 101),
              Record(0, 0), WaitEvent(1, 0), Launch(1, ((0, 1),), (1, 0), 102),
              Copy(2, 0, 0, True), HostView(2, None), Launch(0, ((1, 0),), (0, 0), 103),
              RecordStream(1, 0), Free(1), Alloc(1, 1), Launch(1, (), (1, 0), 104),
              Copy(3, 1, 1, False), HostWrite(2, 1, 105), SyncStream(0), HostView(2, 0)))


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    seed = int(args[0]) if args else 0
    run = run_program(demo_program(), make_strategy("random", seeds.stream(seed, "schedule")))
    print(json.dumps({"seed": seed, "choices": run.choices, "flagged": run.flagged,
                      "outcome": [[list(map(str, k)), list(v)] for k, v in run.outcome]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
