"""lifecycle: legal request state transitions; no tokens after a finish or abort;
output <= max_new_tokens; a stop token inside an accept run cuts the run there and
finishes the request with reason ``stop``.

A run not cut at its stop token is reported when the request ends (or at the end of
the step, if it does not), its site naming how it ended — ``("stop-not-cut",
"length")`` and ``("stop-not-cut", "abort")`` are different bugs (a length-first finish
order; an abort taken before the verify's result), which must not share a finding id.

States come from the per-step snapshots (a request may pass several states within one
step, so a change is legal when the transition graph reaches it; nothing leaves
finished/aborted); tokens and ends from ``Prefilled``/``Verified``/``Finished``/
``Aborted``; limits and stop ids from ``Arrived.spec``.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Set, Tuple

from overlapcheck.protocol import events as E
from overlapcheck.protocol.types import LEGAL

from .base import Checker, Violation


def _reach(state: str) -> Set[str]:
    seen, todo = {state}, [state]
    while todo:
        for nxt in LEGAL.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


REACH = {s: _reach(s) for s in LEGAL}


class Lifecycle(Checker):
    name = "lifecycle"

    def __init__(self, **context) -> None:
        super().__init__()
        self.specs: Dict[int, object] = {}
        self.stop_ids: Dict[int, frozenset] = {}   # per request with a spec: its stop ids
        self.out: Dict[int, List[int]] = {}
        self.state: Dict[int, str] = {}
        self.ended: Dict[int, str] = {}
        self.stopped: Dict[int, int] = {}      # rid -> step its stop token was kept, awaiting Finished
        self.overrun: Set[int] = set()         # kept a stop token, did not finish that step
        self.noted: Set[int] = set()           # already reported for tokens after their end
        # rid -> (the verify's iteration and batch, its run, the stop's index): reported
        # when the request ends (plain values: a run's one-loop handler keeps the same state)
        self.uncut: Dict[int, Tuple[int, int, tuple, int]] = {}
        # per request with a spec, until it ends or keeps a stop token: (its kept tokens,
        # max_new_tokens, its stop ids or None) -- the one lookup a verify's common case makes
        self.open: Dict[int, Tuple[List[int], int, Optional[frozenset]]] = {}

    def _v(self, ev, rid: Optional[int], msg, expected, seen, kind) -> List[Violation]:
        return [Violation(self.name, ev.iteration, msg, expected, seen, (kind,),
                          {"rid": rid, "batch": ev.batch})]

    def on_Arrived(self, ev: E.Arrived):
        if ev.rid in self.out:
            return self._v(ev, ev.rid, f"request {ev.rid} arrived twice", "one arrival per id",
                           "a second arrival", "duplicate-arrival")
        out = self.out[ev.rid] = []
        if ev.spec is not None:
            self.specs[ev.rid] = ev.spec
            stops = self.stop_ids[ev.rid] = frozenset(ev.spec.stop_ids)
            if ev.rid not in self.ended:
                self.open[ev.rid] = (out, ev.spec.max_new_tokens, stops or None)
        return []

    def _keep(self, ev, rid: int, tokens) -> List[Violation]:
        if not tokens:
            return []
        if rid in self.ended or rid in self.stopped or rid in self.overrun:
            self.out.setdefault(rid, []).extend(tokens)
            if rid in self.noted:
                return []
            self.noted.add(rid)
            why = self.ended.get(rid) or "kept a stop token"
            return self._v(ev, rid, f"request {rid} got tokens after it {why}",
                           "no tokens after a finish, abort or stop token",
                           f"tokens {list(tokens)} kept from batch {ev.batch}", "tokens-after-end")
        out = self.out.setdefault(rid, [])
        out.extend(tokens)
        spec = self.specs.get(rid)
        if spec is None or (self.stop_ids[rid].isdisjoint(tokens)
                            and len(out) <= spec.max_new_tokens):
            return []       # nearly every result: no stop token, within the limit
        v: List[Violation] = []
        stops = [i for i, t in enumerate(tokens) if t in spec.stop_ids]
        if stops and stops[0] < len(tokens) - 1:
            self.uncut.setdefault(rid, (ev.iteration, ev.batch, tuple(tokens), stops[0]))
        if stops:
            self.stopped[rid] = ev.iteration
            self.open.pop(rid, None)
        if len(out) > spec.max_new_tokens:
            v += self._v(ev, rid, f"request {rid}: output beyond max_new_tokens",
                         f"at most {spec.max_new_tokens} tokens", f"{len(out)} tokens",
                         "over-length")
        return v

    def on_Prefilled(self, ev: E.Prefilled):
        return [] if ev.dropped or ev.token < 0 else self._keep(ev, ev.rid, (ev.token,))

    def on_Verified(self, ev: E.Verified):
        if ev.dropped:
            return []
        rid, tokens = ev.rid, ev.tokens
        rec = self.open.get(rid)
        if rec is not None:
            out, limit, stops = rec
            if len(out) + len(tokens) <= limit and (stops is None or stops.isdisjoint(tokens)):
                out.extend(tokens)      # nearly every verify: _keep's common case, inline
                return []
        return self._keep(ev, rid, tokens)

    def on_VerifiedBatch(self, ev: E.VerifiedBatch) -> List[Tuple[int, Violation]]:
        """``on_Verified`` over the run in one loop."""
        v: List[Tuple[int, Violation]] = []
        get = self.open.get
        for i, (rid, tokens, dropped) in enumerate(zip(ev.rids, ev.tokens, ev.dropped)):
            if dropped:
                continue
            rec = get(rid)
            if rec is not None:
                out, limit, stops = rec
                if len(out) + len(tokens) <= limit and (stops is None
                                                        or stops.isdisjoint(tokens)):
                    out.extend(tokens)
                    continue
            v += [(ev.position(i), x) for x in self._keep(ev, rid, tokens)]
        return v

    def _uncut(self, rid: int, ending: str) -> List[Violation]:
        iteration, batch, tokens, i = self.uncut.pop(rid)
        return [Violation(self.name, iteration,
                          f"request {rid}: accept run not cut at its stop token",
                          f"the run ends at stop token {tokens[i]} (index {i})",
                          f"tokens {list(tokens)} kept ({ending})", ("stop-not-cut", ending),
                          {"rid": rid, "batch": batch})]

    def _end(self, ev, how: str, reason: str) -> List[Violation]:
        rid = ev.rid
        v = self._uncut(rid, reason) if rid in self.uncut else []
        if rid in self.ended:
            return self._v(ev, rid, f"request {rid} {how} after it {self.ended[rid]}",
                           "one end per request", f"{how} ({reason})", "ended-twice")
        self.ended[rid] = how
        self.open.pop(rid, None)
        stopped = self.stopped.pop(rid, None) is not None or rid in self.overrun
        self.overrun.discard(rid)
        kept = self.out.get(rid, [])
        if tuple(kept) != tuple(ev.tokens):
            v += self._v(ev, rid, f"request {rid} {how} with tokens it did not keep",
                         f"{len(kept)} kept tokens", f"{len(ev.tokens)} tokens reported", "end-tokens")
        if how == "finished" and stopped != (reason == "stop"):
            v += self._v(ev, rid, f"request {rid} finished as '{reason}'",
                         "reason 'stop' exactly when a stop token was kept",
                         f"reason '{reason}', stop token kept: {stopped}", "finish-reason")
        return v

    def on_Finished(self, ev: E.Finished):
        return self._end(ev, "finished", ev.reason)

    def on_Aborted(self, ev: E.Aborted):
        return self._end(ev, "aborted", "abort")

    def on_StepEnd(self, ev: E.StepEnd) -> List[Violation]:
        v: List[Violation] = []
        for rid in list(self.uncut):        # kept its stop token and went on
            v += self._uncut(rid, "live")
        for rid in [r for r, step in self.stopped.items() if step <= ev.iteration]:
            del self.stopped[rid]
            self.overrun.add(rid)
            v += self._v(ev, rid, f"request {rid} kept a stop token but did not finish",
                         "a finish with reason 'stop' in the same step", "still live", "stop-not-finished")
        snap = ev.snapshot
        # a request settled before this snapshot keeps its state: the delta is enough
        state = self.state
        for r in (snap.requests if snap.live is None else snap.live):
            prev = state.get(r.rid)
            if prev == r.state and prev in REACH:
                continue        # most requests, most steps: the same known state
            state[r.rid] = r.state
            if r.state not in REACH:
                v += self._v(ev, r.rid, f"request {r.rid} in unknown state", "a known state",
                             r.state, "unknown-state")
            elif prev is not None and r.state not in REACH.get(prev, ()):
                v += self._v(ev, r.rid, f"request {r.rid}: illegal transition",
                             f"{prev} -> one of {sorted(REACH[prev])}", f"{prev} -> {r.state}",
                             "transition")
        return v
