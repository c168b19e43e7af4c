"""The detector's real proof: a differential test against exhaustive enumeration.

Over Hypothesis-generated small programs (host + up to 2 streams, up to 4 buffers,
unique written values, every read, every overwritten value and every final buffer value
observed, frees, re-allocations and ``record_stream`` included), the detector flags a
program if and only if the program's sim schedules give more than one distinct outcome,
and its verdict is the same on every schedule (it does not depend on timing).

A flagged program with a single outcome is inconclusive only when every race reported
on any schedule has, as one side, a write that some schedule made *silent* (a copy
writing the value its cell already held, which no observer can tell from no write);
such programs are discarded, never counted as passing.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from overlapcheck.device.buffers import DEVICE, PAGEABLE, PINNED
from overlapcheck.device.explore import (
    Alloc, Buf, Copy, Free, HostView, HostWrite, Launch, Program, Record, RecordStream,
    ScheduleLimit, SyncDevice, SyncEvent, SyncStream, ToHost, WaitEvent, WaitStream,
    enumerate_schedules)

SCHEDULE_LIMIT = 1000

# Instruction kinds, repeated to weight them.
KINDS = (["launch"] * 8 + ["copy"] * 4 + ["host_write", "host_view", "wait_stream"] * 2
         + ["realloc", "free", "alloc", "record", "wait_event", "record_stream", "to_host",
            "sync_stream", "sync_event", "sync_device"])


def _streams(ns: int, base: int):
    """A stream index whose simplest draw is ``base``."""
    return st.integers(0, ns - 1).map(lambda x: (x + base) % ns)


@st.composite
def programs(draw, max_body: int = 8) -> Program:
    """A valid small program: no access to a freed buffer, copies between buffers of
    the same size (not host to host), host accessors on host buffers only, and every
    written value unique. Half the programs are *careful*: before an access, they
    usually order it after other contexts' earlier accesses to the same buffers (by a
    stream wait, an event, or a host synchronization), and pledge a buffer to the
    streams that used it before freeing it; the forgotten cases are the races."""
    ns = draw(st.sampled_from([2, 2, 1]))
    ne = draw(st.sampled_from([1, 2, 0]))
    nb = draw(st.sampled_from([2, 3, 1, 4]))
    careful = draw(st.booleans())
    bufs = []
    spaces = [DEVICE, PINNED, DEVICE, DEVICE, PINNED, PAGEABLE]
    for i in range(nb):
        space = spaces[(draw(st.integers(0, 5)) + i) % 6]
        stream = draw(_streams(ns, i)) if space == DEVICE else 0
        bufs.append(Buf(space, draw(st.integers(1, 2)), stream))
    live = [True] * nb
    home = [b.stream for b in bufs]          # allocation stream of each live buffer
    used = [set() for _ in range(nb)]        # streams that accessed it, not yet ordered
    body: list = []
    events = st.integers(0, max(ne - 1, 0))

    def order(ctx: int, bs) -> None:   # ctx: a stream, or -1 for the host
        for b in bs:
            for t in sorted(used[b] - {ctx}) if careful else ():
                if draw(st.integers(0, 2)) == 2:
                    continue                 # forgotten
                how = draw(st.integers(0, 2))
                if ctx >= 0 and (how == 0 or ne == 0):
                    body.append(WaitStream(ctx, t))
                elif ctx >= 0:
                    e = draw(events)
                    body.extend([Record(e, t), WaitEvent(ctx, e)])
                elif how == 0 or (how == 1 and ne == 0):
                    body.append(SyncStream(t))
                elif how == 1:
                    e = draw(events)
                    body.extend([Record(e, t), SyncEvent(e)])
                else:
                    body.append(SyncDevice())
                used[b].discard(t)
            if ctx >= 0:
                used[b].add(ctx)

    last = ns - 1   # stream of the latest device work
    n = draw(st.integers(4, max_body))
    while len(body) < n:
        value = 100 + len(body)
        nxt = _streams(ns, last + 1)
        dev = [i for i in range(nb) if live[i] and bufs[i].space == DEVICE]
        host = [i for i in range(nb) if live[i] and bufs[i].space != DEVICE]
        pairs = [(d, s) for d in range(nb) for s in range(nb)
                 if d != s and live[d] and live[s] and bufs[d].rows == bufs[s].rows
                 and DEVICE in (bufs[d].space, bufs[s].space)]
        ok = {"launch": bool(dev), "copy": bool(pairs), "host_write": bool(host),
              "host_view": bool(host), "record": ne > 0, "wait_event": ne > 0,
              "wait_stream": ns > 1, "sync_stream": True, "sync_event": ne > 0,
              "sync_device": True, "to_host": bool(dev), "record_stream": bool(dev) and ns > 1,
              "free": any(live), "alloc": not all(live), "realloc": any(live)}
        kind = draw(st.sampled_from([x for x in KINDS if ok[x]]))
        if kind == "launch":
            cell = lambda: (lambda b: (b, draw(st.integers(0, bufs[b].rows - 1))))(
                draw(st.sampled_from(dev)))
            reads = tuple(cell() for _ in range(draw(st.sampled_from([1, 0, 2]))))
            write = None if draw(st.integers(0, 5)) == 5 else cell()
            s = last = draw(nxt)
            order(s, sorted({b for b, _ in reads + ((write,) if write else ())}))
            ins = Launch(s, reads, write, 100 + len(body))
        elif kind == "copy":
            d, src = draw(st.sampled_from(pairs))
            s = last = draw(nxt)
            order(s, [d, src])
            ins = Copy(d, src, s, draw(st.booleans()))
        elif kind in ("host_write", "host_view"):
            b = draw(st.sampled_from(host))
            row = draw(st.integers(0, bufs[b].rows - 1))
            order(-1, [b])
            ins = HostWrite(b, row, 100 + len(body)) if kind == "host_write" else HostView(
                b, None if draw(st.booleans()) else row)
        elif kind == "to_host":
            b, s = draw(st.sampled_from(dev)), draw(nxt)
            last = s
            order(s, [b])
            ins = ToHost(b, s)
        elif kind == "record":
            ins = Record(draw(events), draw(_streams(ns, last)))
        elif kind == "wait_event":
            ins = WaitEvent(draw(nxt), draw(events))
        elif kind == "wait_stream":
            s = draw(nxt)
            ins = WaitStream(s, 1 - s)
        elif kind == "sync_stream":
            ins = SyncStream(draw(_streams(ns, last)))
        elif kind == "sync_event":
            ins = SyncEvent(draw(events))
        elif kind == "sync_device":
            ins = SyncDevice()
        elif kind == "record_stream":
            b = draw(st.sampled_from(dev))
            ins = RecordStream(b, draw(_streams(ns, home[b] + 1)))
        elif kind in ("free", "realloc"):
            b = draw(st.sampled_from([i for i in range(nb) if live[i]]))
            if careful and bufs[b].space == DEVICE:
                body.extend(RecordStream(b, t) for t in sorted(used[b] - {home[b]}))
            live[b] = False
            used[b] = set()
            ins = Free(b)
            if kind == "realloc":   # free, then allocate the same size again at once
                body.append(ins)
                live[b] = True
                home[b] = draw(_streams(ns, bufs[b].stream))
                ins = Alloc(b, home[b])
        else:
            b = draw(st.sampled_from([i for i in range(nb) if not live[i]]))
            live[b] = True
            home[b] = draw(_streams(ns, bufs[b].stream))
            ins = Alloc(b, home[b])
        body.append(ins)
    return Program(ns, ne, tuple(bufs), tuple(body))


@dataclass
class Tally:
    programs: int = 0
    racy: int = 0
    schedules: int = 0
    too_big: int = 0
    silent: int = 0
    max_schedules: int = 0

    def __str__(self) -> str:
        return (f"{self.programs} programs ({self.racy} racy, {self.programs - self.racy} "
                f"race-free), {self.schedules} schedules enumerated (largest tree "
                f"{self.max_schedules}); discarded: {self.too_big} over {SCHEDULE_LIMIT} "
                f"schedules, {self.silent} inconclusive (silent store)")


def _masked(report, silent) -> bool:
    """Is one side of ``report`` a write by an instruction that made a silent store?"""
    return any(a.write and a.op.name in {f"i{k}" for k in silent}
               for a in (report.current, report.previous))


def check_program(program: Program, tally: Tally) -> None:
    """Enumerate every schedule of ``program`` and check the two properties."""
    outcomes, verdicts, silent, reports, n = set(), {}, set(), [], 0
    try:
        for run in enumerate_schedules(program, SCHEDULE_LIMIT):
            n += 1
            outcomes.add(run.outcome)
            verdicts.setdefault(run.flagged, run)
            silent |= run.silent
            reports.extend(run.reports)
    except ScheduleLimit:
        tally.too_big += 1
        assume(False)
    flagged = True in verdicts
    if flagged and len(outcomes) == 1 and all(_masked(r, silent) for r in reports):
        tally.silent += 1
        assume(False)
    assert len(verdicts) == 1, (
        f"the verdict depends on the schedule:\n{program}\nflagged with choices "
        f"{verdicts[True].choices}: {verdicts[True].reports[0]}\n"
        f"clean with choices {verdicts[False].choices}")
    if flagged:
        assert len(outcomes) > 1, (
            f"flagged, but all {n} schedules give one outcome:\n{program}\n"
            + "\n".join(map(str, verdicts[True].reports)))
    else:
        assert len(outcomes) == 1, (
            f"not flagged, but {n} schedules give {len(outcomes)} outcomes:\n{program}")
    tally.programs += 1
    tally.racy += flagged
    tally.schedules += n
    tally.max_schedules = max(tally.max_schedules, n)


def _run(examples: int, derandomize: bool) -> Tally:
    tally = Tally()

    @settings(max_examples=examples, derandomize=derandomize, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    @given(programs())
    def prop(program):
        check_program(program, tally)

    start = time.monotonic()
    prop()
    print(f"differential: {tally} in {time.monotonic() - start:.1f} s")
    return tally


def test_detector_flags_iff_schedules_disagree():
    tally = _run(80, derandomize=True)
    assert tally.programs >= 60 and tally.racy and tally.programs - tally.racy


@pytest.mark.nightly
def test_detector_flags_iff_schedules_disagree_full():
    tally = _run(600, derandomize=False)
    assert tally.programs >= 500 and tally.racy and tally.programs - tally.racy
