"""liveness: every admitted request ends within a step bound, and no wait is stuck.

* zombie: a request admitted (given a request-pool row) at step a, still live at step
  ``a + bound`` with ``bound = base + per_token * (prompt + max_new_tokens)`` — by then
  it has had more batches than it could use. Re-admission after a retraction restarts
  the clock. The violation is ``fatal``: the driver stops a run that would otherwise
  decode forever.
* livelock (with ``engine_config`` in the context): requests are retracted while the
  engine makes no progress — no kept token, no request ending — for more than
  ``base + 2 * sum(prefill batches of each live request)`` steps, a prefill taking
  ``ceil(min(prompt + max_new_tokens, max_context) / chunk_size)`` batches. Without
  progress a step re-prefills (a fresh prefill ends in a sampled token), sits out
  while retracted pages are pending (a step or two), or decodes, and a decode keeps
  tokens for the survivors of its retractions when it is processed; so only a loop
  that retracts everyone, re-admits them and retracts them again stays without
  progress that long (docs/design.md §7, class 22). It catches such a loop in tens of
  steps where the engine's own bound takes hundreds (a retraction restarts the
  zombie clock). Fatal, like the others.
* stuck wait: the engine reports ``Stalled`` when a host wait can never complete (the
  sim's ``StuckWait``: device work behind a later host action, or a logical rank that
  never joins a collective) or its own step bound runs out; the violation names it.

Context: ``liveness_bound=(base, per_token)``, default (64, 8); ``engine_config``.
"""
from __future__ import annotations

from typing import Dict, List, Set, Tuple

from overlapcheck.protocol import events as E

from .base import Checker, Violation

DEFAULT_BOUND = (64, 8)
INF = float("inf")


class Liveness(Checker):
    name = "liveness"
    fatal = True

    def __init__(self, liveness_bound: Tuple[int, int] = DEFAULT_BOUND, engine_config=None,
                 **context) -> None:
        super().__init__()
        self.base, self.per_token = liveness_bound
        self.size: Dict[int, int] = {}
        self.admitted: Dict[int, int] = {}
        # no admitted request is a zombie before this step (a lower bound of their
        # deadlines, made exact at each scan): most steps need no scan
        self.due: float = INF
        self.reported: Set[int] = set()
        # livelock: the engine's prefill geometry (None: the rule is off)
        self.cfg = engine_config if hasattr(engine_config, "chunk_size") else None
        self.live: Set[int] = set()
        self.progress = 0              # the step of the last kept token or ended request
        self.retracted_since = 0       # retractions since then
        self.livelock_reported = False

    def bound(self, rid: int) -> int:
        return self.base + self.per_token * self.size.get(rid, 0)

    def on_Arrived(self, ev: E.Arrived):
        if ev.spec is not None:
            self.size[ev.rid] = len(ev.spec.prompt) + ev.spec.max_new_tokens
            self.due = -1        # a bound may have changed: scan at the next step
        if not self.live:
            self.progress = ev.iteration     # an idle engine owes no progress
        self.live.add(ev.rid)

    def on_RowAssigned(self, ev: E.RowAssigned):
        self.admitted[ev.rid] = ev.iteration
        self.due = min(self.due, ev.iteration + self.bound(ev.rid))

    def _left(self, ev):
        self.admitted.pop(ev.rid, None)

    def _ended(self, ev):
        self._left(ev)
        self.live.discard(ev.rid)
        self._progressed(ev)

    def _progressed(self, ev):
        self.progress, self.retracted_since = ev.iteration, 0

    def on_Retracted(self, ev: E.Retracted):
        self._left(ev)
        self.retracted_since += 1

    on_Finished = on_Aborted = _ended

    def on_Prefilled(self, ev: E.Prefilled):
        if ev.token >= 0 and not ev.dropped:
            self._progressed(ev)

    def on_Verified(self, ev: E.Verified):
        if ev.tokens and not ev.dropped:
            self.progress, self.retracted_since = ev.iteration, 0    # _progressed, inline

    def on_VerifiedBatch(self, ev: E.VerifiedBatch):
        """``on_Verified`` over the run: progress when any entry kept tokens."""
        for tokens, dropped in zip(ev.tokens, ev.dropped):
            if tokens and not dropped:
                self.progress, self.retracted_since = ev.iteration, 0
                break

    def _livelock_bound(self) -> int:
        cfg = self.cfg
        batches = sum(-(-min(self.size.get(rid, 0), cfg.max_context) // cfg.chunk_size)
                      for rid in self.live)
        return self.base + 2 * batches

    def _livelock(self, ev: E.StepEnd) -> List[Violation]:
        if (self.cfg is None or self.livelock_reported or not self.retracted_since
                or not self.live):
            return []
        idle, bound = ev.iteration - self.progress, self._livelock_bound()
        if idle <= bound:
            return []
        self.livelock_reported = True
        return [Violation(
            self.name, ev.iteration, f"livelock: {self.retracted_since} retraction(s) and no "
            f"progress since step {self.progress} (live requests {sorted(self.live)[:10]})",
            f"a kept token or an ended request within {bound} steps",
            f"none for {idle} steps", ("livelock",),
            {"since": self.progress, "retractions": self.retracted_since,
             "live": sorted(self.live)})]

    def on_StepEnd(self, ev: E.StepEnd) -> List[Violation]:
        out = self._livelock(ev)
        if ev.iteration <= self.due:
            return out
        for rid, since in self.admitted.items():
            if rid not in self.reported and ev.iteration - since > self.bound(rid):
                self.reported.add(rid)
                out.append(Violation(
                    self.name, ev.iteration, f"zombie: request {rid} admitted at step {since} "
                    f"has not ended", f"ends within {self.bound(rid)} steps of its admission",
                    f"still live after {ev.iteration - since} steps", ("zombie",),
                    {"rid": rid, "admitted": since}))
        self.due = min((since + self.bound(rid) for rid, since in self.admitted.items()
                        if rid not in self.reported), default=INF)
        return out

    def on_Stalled(self, ev: E.Stalled) -> List[Violation]:
        if ev.kind == "wait":
            return [Violation(self.name, ev.iteration, f"stuck wait: {ev.detail}",
                              "every host wait completes", "a wait that can never complete",
                              ("stuck-wait",), {"detail": ev.detail})]
        return [Violation(self.name, ev.iteration, f"run stalled: {ev.detail}",
                          "the workload ends within the engine's step bound", ev.detail,
                          ("engine-bound",), {"detail": ev.detail})]
