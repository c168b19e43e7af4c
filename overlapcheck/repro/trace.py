"""Chrome / Perfetto trace of a sim run: one track per stream, one slice per
retired device operation, and a host track with one slice per engine step.

Time is logical: the sim's host-call counter (``rt.calls``), 100 units per call,
device operations retired during one call spread across it in retire order. Open the
file in ui.perfetto.dev or chrome://tracing.
"""
from __future__ import annotations

import json
from collections import defaultdict
from typing import Dict, List

from .format import write_atomic

UNIT = 100


def trace_events(retired, marks) -> List[dict]:
    events: List[dict] = [{"ph": "M", "pid": 1, "tid": 0, "name": "thread_name",
                           "args": {"name": "host (engine steps)"}}]
    tids: Dict[str, int] = {}
    per_call: Dict[int, int] = defaultdict(int)
    for _, _, call in retired:
        per_call[call] += 1
    seen: Dict[int, int] = defaultdict(int)
    for stream, name, call in retired:
        tid = tids.get(stream)
        if tid is None:
            tid = tids[stream] = len(tids) + 1
            events.append({"ph": "M", "pid": 1, "tid": tid, "name": "thread_name",
                           "args": {"name": f"stream {stream}"}})
        n = per_call[call]
        k = seen[call]
        seen[call] += 1
        width = UNIT / (n + 1)
        events.append({"ph": "X", "pid": 1, "tid": tid, "name": name, "cat": stream,
                       "ts": call * UNIT + k * width, "dur": max(width * 0.9, 1.0),
                       "args": {"host_call": call}})
    prev = 0
    for iteration, call in marks:
        events.append({"ph": "X", "pid": 1, "tid": 0, "name": f"step {iteration}",
                       "cat": "host", "ts": prev * UNIT, "dur": max((call - prev) * UNIT, 1),
                       "args": {"iteration": iteration}})
        prev = call
    return events


def write_trace(outcome, path: str) -> None:
    """Write the trace of a run's ``Outcome`` (its retired ops and step marks)."""
    doc = {"traceEvents": trace_events(outcome.retired, outcome.marks),
           "displayTimeUnit": "ns",
           "otherData": {"digest": outcome.digest, "steps": outcome.steps}}
    write_atomic(path, json.dumps(doc))
