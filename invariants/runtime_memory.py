"""runtime-memory: live runtime allocations return to the engine's steady set at idle,
and their count stays bounded over a run (docs/design.md §5.2).

The engine allocates its long-lived buffers (KV, tables, FutureMap, pinned staging and
results) when it is built, and per batch only index and output buffers, which the host
frees right after launching them (the allocator's stream pledges keep their memory from
reuse until the device is done, §4.6). The snapshot carries the runtime's live
allocations by name (``Snapshot.buffers``) and the set the engine held before its first
step (``Snapshot.steady_buffers``). So:

* at an idle step end the live allocations are exactly the steady set: a buffer never
  freed (or a long-lived one freed) is named with both counts;
* at every step end, the live allocations beyond the steady set are at most
  ``PER_BATCH`` per batch in flight (a batch stages and outputs 7 buffers at most): a
  buffer leaked once per step is reported within a few steps even in a run that never
  goes idle.

Without those snapshot fields (another target) the checker is idle.
"""
from __future__ import annotations

from typing import Dict, List, Set

from overlapcheck.protocol import events as E

from .base import Checker, Violation

PER_BATCH = 8


class RuntimeMemory(Checker):
    name = "runtime-memory"
    targets = ("reference",)

    def __init__(self, **context) -> None:
        super().__init__()
        self.reported: Set[tuple] = set()

    def _v(self, ev, site: tuple, msg: str, expected: str, seen: str, **details) -> List[Violation]:
        if site in self.reported:
            return []
        self.reported.add(site)
        return [Violation(self.name, ev.iteration, msg, expected, seen, site,
                          {"batch": ev.batch, **details})]

    def on_StepEnd(self, ev: E.StepEnd) -> List[Violation]:
        s = ev.snapshot
        if not s.steady_buffers or s.buffers == s.steady_buffers:
            return []
        live: Dict[str, int] = dict(s.buffers)
        steady: Dict[str, int] = dict(s.steady_buffers)
        if s.idle:
            out: List[Violation] = []
            for name in sorted(set(live) | set(steady)):
                n, want = live.get(name, 0), steady.get(name, 0)
                if n > want:
                    out += self._v(ev, ("not-freed", name), f"idle with {n - want} runtime "
                                   f"buffer(s) '{name}' still allocated", f"{want} live "
                                   f"'{name}' (the engine's steady set)", f"{n} live: "
                                   f"allocated during the run and never freed", buffer=name,
                                   live=n, steady=want)
                elif n < want:
                    out += self._v(ev, ("steady-freed", name), f"idle with the engine's "
                                   f"long-lived buffer '{name}' freed", f"{want} live "
                                   f"'{name}' (the engine's steady set)", f"{n} live",
                                   buffer=name, live=n, steady=want)
            return out
        extra = sum(live.values()) - sum(steady.values())
        bound = PER_BATCH * len(s.inflight)
        if extra > bound:
            grown = sorted(((live.get(k, 0) - steady.get(k, 0), k) for k in live), reverse=True)
            top = ", ".join(f"'{k}' +{d}" for d, k in grown[:3] if d > 0)
            return self._v(ev, ("unbounded",), f"{extra} runtime buffers live beyond the "
                           f"engine's steady set with {len(s.inflight)} batch(es) in flight",
                           f"at most {bound} ({PER_BATCH} per batch in flight)",
                           f"{extra} ({top})", extra=extra, bound=bound)
        return []
