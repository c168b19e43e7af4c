"""metrics: the reported statistics equal what the per-request records give, and the
per-request records equal what the events showed.

Counted from events: kept tokens and accept lengths per request (``Prefilled`` /
``Verified`` not dropped), finishes, aborts, retractions. A request ends once: a
second ``Finished``/``Aborted``, or a kept verify after its end (a lagged batch
counted again), is a violation at once. At ``RunEnd`` the run's ``Summary`` (mean
accept length, tokens, verifies, finishes, aborts, retractions) and each
``RequestResult`` are held against those counts.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Dict, List, Tuple

from overlapcheck.protocol import events as E

from .base import Checker, Violation


class Metrics(Checker):
    name = "metrics"

    def __init__(self, **context) -> None:
        super().__init__()
        self.tokens: Dict[int, List[int]] = defaultdict(list)
        self.accepts: Dict[int, List[int]] = defaultdict(list)
        self.ended: Dict[int, str] = {}
        self.retractions = 0

    def _v(self, step, msg, expected, seen, kind, **details) -> Violation:
        return Violation(self.name, step, msg, expected, seen, (kind,), details)

    def _kept_after_end(self, ev, what: str) -> List[Violation]:
        if ev.rid in self.ended:
            return [self._v(ev.iteration, f"request {ev.rid}: {what} of batch {ev.batch} counted "
                            f"after the request {self.ended[ev.rid]}", "results of a lagged batch "
                            "are dropped once the request ended", f"{what} kept", "counted-after-end",
                            rid=ev.rid, batch=ev.batch)]
        return []

    def on_Prefilled(self, ev: E.Prefilled):
        if ev.dropped or ev.token < 0:
            return []
        self.tokens[ev.rid].append(ev.token)
        return self._kept_after_end(ev, "prefill token")

    def on_VerifiedBatch(self, ev: E.VerifiedBatch) -> List[Tuple[int, Violation]]:
        """``on_Verified`` over the run in one loop."""
        out: List[Tuple[int, Violation]] = []
        accepts_of, tokens_of, ended = self.accepts, self.tokens, self.ended
        for i, (rid, index, got, tokens, dropped) in enumerate(zip(
                ev.rids, ev.index, ev.accept_len, ev.tokens, ev.dropped)):
            if dropped:
                continue
            accepts = accepts_of[rid]
            if index == len(accepts) and rid not in ended:
                accepts.append(got)
                tokens_of[rid].extend(tokens)
            else:
                out += [(ev.position(i), v) for v in self.on_Verified(ev.verified(i))]
        return out

    def on_Verified(self, ev: E.Verified):
        if ev.dropped:
            return []
        accepts = self.accepts[ev.rid]
        if ev.index == len(accepts) and ev.rid not in self.ended:
            accepts.append(ev.accept_len)      # nearly every verify: in sequence, live
            self.tokens[ev.rid].extend(ev.tokens)
            return []
        out = self._kept_after_end(ev, "verify")
        if ev.index != len(self.accepts[ev.rid]):
            out.append(self._v(ev.iteration, f"request {ev.rid}: verify index out of sequence",
                               f"verify #{len(self.accepts[ev.rid])}", f"verify #{ev.index}",
                               "verify-index", rid=ev.rid))
        self.accepts[ev.rid].append(ev.accept_len)
        self.tokens[ev.rid].extend(ev.tokens)
        return out

    def _end(self, ev, how: str) -> List[Violation]:
        prev = self.ended.get(ev.rid)
        self.ended[ev.rid] = how
        if prev is not None:
            return [self._v(ev.iteration, f"request {ev.rid} ended twice", "one end per request",
                            f"{how} after it already {prev}", "ended-twice", rid=ev.rid)]
        return []

    def on_Finished(self, ev):
        return self._end(ev, "finished")

    def on_Aborted(self, ev):
        return self._end(ev, "aborted")

    def on_Retracted(self, ev):
        self.retractions += 1

    def on_RunEnd(self, ev: E.RunEnd) -> List[Violation]:
        res, it, out = ev.result, ev.iteration, []
        for rid, r in sorted(res.requests.items()):
            for field, mine in (("tokens", tuple(self.tokens.get(rid, ()))),
                                ("accept_lens", tuple(self.accepts.get(rid, ())))):
                if getattr(r, field) != mine:
                    out.append(self._v(it, f"request {rid}: reported {field} differ from the events",
                                       f"{field} {list(mine)} (events)",
                                       f"{field} {list(getattr(r, field))} (result)",
                                       f"record-{field}", rid=rid))
        accs = [a for v in self.accepts.values() for a in v]
        counted = {
            "tokens": sum(len(v) for v in self.tokens.values()), "verifies": len(accs),
            "mean_accept_length": round(sum(accs) / len(accs), 4) if accs else 0.0,
            "finished": sum(h == "finished" for h in self.ended.values()),
            "aborts": sum(h == "aborted" for h in self.ended.values()),
            "retractions": self.retractions,
        }
        for key, want in counted.items():
            got = getattr(res.summary, key)
            if abs(got - want) > 1e-4:
                out.append(self._v(it, f"summary {key} differs from the per-request counts",
                                   f"{key} {want} (counted from events)", f"{key} {got} (reported)",
                                   f"summary-{key}", key=key))
        return out
