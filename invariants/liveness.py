"""liveness: every admitted request ends within a step bound, and no wait is stuck.

* zombie: a request admitted (given a request-pool row) at step a, still live at step
  ``a + bound`` with ``bound = base + per_token * (prompt + max_new_tokens)`` — by then
  it has had more batches than it could use. Re-admission after a retraction restarts
  the clock. The violation is ``fatal``: the driver stops a run that would otherwise
  decode forever.
* stuck wait: the engine reports ``Stalled`` when a host wait can never complete (the
  sim's ``StuckWait``: device work behind a later host action, or a logical rank that
  never joins a collective) or its own step bound runs out; the violation names it.

Context: ``liveness_bound=(base, per_token)``, default (64, 8).
"""
from __future__ import annotations

from typing import Dict, List, Set, Tuple

from overlapcheck.engine import events as E

from .base import Checker, Violation

DEFAULT_BOUND = (64, 8)


class Liveness(Checker):
    name = "liveness"
    fatal = True

    def __init__(self, liveness_bound: Tuple[int, int] = DEFAULT_BOUND, **context) -> None:
        super().__init__()
        self.base, self.per_token = liveness_bound
        self.size: Dict[int, int] = {}
        self.admitted: Dict[int, int] = {}
        self.reported: Set[int] = set()

    def bound(self, rid: int) -> int:
        return self.base + self.per_token * self.size.get(rid, 0)

    def on_Arrived(self, ev: E.Arrived):
        if ev.spec is not None:
            self.size[ev.rid] = len(ev.spec.prompt) + ev.spec.max_new_tokens

    def on_RowAssigned(self, ev: E.RowAssigned):
        self.admitted[ev.rid] = ev.iteration

    def _left(self, ev):
        self.admitted.pop(ev.rid, None)

    on_Finished = on_Aborted = on_Retracted = _left

    def on_StepEnd(self, ev: E.StepEnd) -> List[Violation]:
        out = []
        for rid, since in self.admitted.items():
            if rid not in self.reported and ev.iteration - since > self.bound(rid):
                self.reported.add(rid)
                out.append(Violation(
                    self.name, ev.iteration, f"zombie: request {rid} admitted at step {since} "
                    f"has not ended", f"ends within {self.bound(rid)} steps of its admission",
                    f"still live after {ev.iteration - since} steps", ("zombie",),
                    {"rid": rid, "admitted": since}))
        return out

    def on_Stalled(self, ev: E.Stalled) -> List[Violation]:
        if ev.kind == "wait":
            return [Violation(self.name, ev.iteration, f"stuck wait: {ev.detail}",
                              "every host wait completes", "a wait that can never complete",
                              ("stuck-wait",), {"detail": ev.detail})]
        return [Violation(self.name, ev.iteration, f"run stalled: {ev.detail}",
                          "the workload ends within the engine's step bound", ev.detail,
                          ("engine-bound",), {"detail": ev.detail})]
