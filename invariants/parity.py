"""parity: per request, the overlap run equals the reference (non-overlap) run of the
same workload (docs/design.md §5.2).

* tokens: each token the host keeps equals the reference's at that position; a request
  finished in both has the same tokens and finish reason; an aborted request's output
  (in either run) need only be a prefix of the other's;
* accept lengths are compared by the request's own verify count (``Verified.index``);
  verifies that rode a batch after the finish was known are dropped by the engine and
  never compared; retraction is invisible (it changes neither).

An output that runs past the reference's is reported when the request ends, its site
naming how it ended (``("length", "abort")``, ``("length", "length")``, ...): the same
symptom from different bugs gets different finding ids.

Context: ``reference`` (the reference ``RunResult``; without it this checker is idle)
and ``parity_accept`` (default True; False for a no-spec reference: tokens only;
``"unretracted"`` where a retraction shifts later verifies, as SGLang's re-prefill
does: accept lengths of a request until either run retracts it).
"""
from __future__ import annotations

from typing import Dict, List, Set, Tuple

from overlapcheck.protocol import events as E

from .base import Checker, Violation

ABORT = "abort"


class Parity(Checker):
    name = "parity"

    def __init__(self, reference=None, parity_accept: bool = True, **context) -> None:
        super().__init__()
        self.ref = reference.requests if reference is not None else None
        self.idle = self.ref is None
        self.accept = bool(parity_accept)
        # requests whose accept lengths are no longer comparable (parity_accept
        # "unretracted": retracted in either run)
        self.unaligned: Set[int] = set()
        self.until_retract = parity_accept == "unretracted"
        if self.until_retract and self.ref is not None:
            self.unaligned = {rid for rid, r in self.ref.items() if r.retractions}
        # per request that kept tokens: [how many so far, the reference's tokens, its
        # accept lengths] (one lookup for a verify's common case)
        self.cursor: Dict[int, list] = {}
        self.diverged: Set[int] = set()
        # rid -> (event, what the reference had, the extra token): reported at its end
        self.overran: Dict[int, Tuple[object, str, str]] = {}

    def _ref_accepts(self, rid: int, ref) -> tuple:
        return () if rid in self.unaligned else ref.accept_lens

    def on_Retracted(self, ev: E.Retracted):
        if self.until_retract:
            self.unaligned.add(ev.rid)
            cur = self.cursor.get(ev.rid)
            if cur is not None:
                cur[2] = ()
        return []

    def _v(self, ev, rid: int, msg: str, expected: str, seen: str, kind: str) -> List[Violation]:
        self.diverged.add(rid)
        return [Violation(self.name, ev.iteration, f"request {rid}: {msg}", expected, seen,
                          (kind,), {"rid": rid, "batch": ev.batch})]

    def _append(self, ev, rid: int, tokens) -> List[Violation]:
        if self.ref is None or rid in self.diverged:
            return []
        ref = self.ref.get(rid)
        if ref is None:
            return self._v(ev, rid, "not in the reference run", "a request of the reference",
                           "an unknown request", "unknown-request")
        return self._tokens(ev, rid, ref, tokens)

    def _tokens(self, ev, rid: int, ref, tokens) -> List[Violation]:
        cur = self.cursor.get(rid)
        if cur is None:
            cur = self.cursor[rid] = [0, ref.tokens, self._ref_accepts(rid, ref)]
        p = cur[0]
        if ref.tokens[p:p + len(tokens)] == tokens:
            cur[0] = p + len(tokens)           # nearly every result: the reference's next tokens
            return []
        for tok in tokens:
            cur[0] = p + 1
            if p < len(ref.tokens):
                if ref.tokens[p] != tok:
                    return self._v(ev, rid, f"token {p} differs from the reference",
                                   f"token {ref.tokens[p]} at position {p} (reference)",
                                   f"token {tok}", "token")
            elif ref.finish_reason != ABORT:
                self.diverged.add(rid)
                self.overran[rid] = (ev, f"{len(ref.tokens)} tokens, then "
                                         f"'{ref.finish_reason}'", f"token {tok} at position {p}")
                return []
            p += 1
        return []

    def on_Prefilled(self, ev: E.Prefilled):
        if not ev.dropped and ev.token >= 0:
            return self._append(ev, ev.rid, (ev.token,))
        return []

    def on_VerifiedBatch(self, ev: E.VerifiedBatch) -> List[Tuple[int, Violation]]:
        """``on_Verified`` over the run in one loop."""
        out: List[Tuple[int, Violation]] = []
        if self.ref is None:
            return out
        cursor, diverged, accept = self.cursor, self.diverged, self.accept
        for i, (rid, index, got, tokens, dropped) in enumerate(zip(
                ev.rids, ev.index, ev.accept_len, ev.tokens, ev.dropped)):
            if dropped or rid in diverged:
                continue
            cur = cursor.get(rid)
            if cur is not None:     # the common case, as in on_Verified
                p, ref_tokens, ref_accepts = cur
                if ((not accept or index >= len(ref_accepts) or ref_accepts[index] == got)
                        and ref_tokens[p:p + len(tokens)] == tokens):
                    cur[0] = p + len(tokens)
                    continue
            out += [(ev.position(i), v) for v in self.on_Verified(ev.verified(i))]
        return out

    def on_Verified(self, ev: E.Verified):
        if ev.dropped or self.ref is None or ev.rid in self.diverged:
            return []
        cur = self.cursor.get(ev.rid)
        if cur is not None:     # the common case: accept length and tokens as the reference's
            p, ref_tokens, ref_accepts = cur
            tokens = ev.tokens
            if ((not self.accept or ev.index >= len(ref_accepts)
                 or ref_accepts[ev.index] == ev.accept_len)
                    and ref_tokens[p:p + len(tokens)] == tokens):
                cur[0] = p + len(tokens)
                return []
        ref = self.ref.get(ev.rid)
        if ref is None:
            return self._append(ev, ev.rid, ev.tokens)
        accepts = self._ref_accepts(ev.rid, ref)
        if (self.accept and ev.index < len(accepts)
                and accepts[ev.index] != ev.accept_len):
            return self._v(ev, ev.rid, f"accept length of verify #{ev.index} differs from the "
                           f"reference", f"accept length {ref.accept_lens[ev.index]} (reference)",
                           f"accept length {ev.accept_len}", "accept-length")
        return self._tokens(ev, ev.rid, ref, ev.tokens)

    def _overran(self, rid: int, ending: str) -> List[Violation]:
        ev, expected, seen = self.overran.pop(rid)
        return [Violation(self.name, ev.iteration,
                          f"request {rid}: output runs past the reference's ({expected})",
                          expected, f"{seen} ({ending})", ("length", ending),
                          {"rid": rid, "batch": ev.batch})]

    def on_Aborted(self, ev: E.Aborted):
        return self._overran(ev.rid, ABORT) if ev.rid in self.overran else []

    def on_RunEnd(self, ev: E.RunEnd):
        return [v for rid in sorted(self.overran) for v in self._overran(rid, "live")]

    def on_Finished(self, ev: E.Finished):
        if ev.rid in self.overran:
            return self._overran(ev.rid, ev.reason)
        if self.ref is None or ev.rid in self.diverged:
            return []
        ref = self.ref.get(ev.rid)
        if ref is None or ref.finish_reason == ABORT:
            return []
        if (ref.finish_reason, len(ref.tokens)) != (ev.reason, len(ev.tokens)):
            return self._v(ev, ev.rid, "finished unlike the reference",
                           f"'{ref.finish_reason}' after {len(ref.tokens)} tokens (reference)",
                           f"'{ev.reason}' after {len(ev.tokens)} tokens", "finish")
        return []
