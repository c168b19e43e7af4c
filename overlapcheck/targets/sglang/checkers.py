"""sglang-golden: every token a target keeps is the model's own continuation of the
request's prefix (the fake model's, or in real-forward mode the tiny Llama's greedy
one), and every accept length is the one the fake draft and target give there —
computed from the token list alone, with no engine (docs/design.md §9.3).

Parity compares two schedules of the same engine and misses what both share; this
oracle does not trust the engine. A kept token that differs means the model read
another context than the request's own (a slot of another request, a stale or recycled
slot, a wrong table row): the SGLang target's fake worker reads tokens through SGLang's
request->token table and KV slots.

Context: ``golden`` (an object with ``next(spec, tokens)``, ``k`` (draft steps) and,
with k > 0, ``accept_len(spec, tokens)``; optionally ``covers(spec)``, the requests it
judges), as ``SglangTarget().checker_context(cfg)`` gives it; without it this checker
is idle. Requests arrive with their spec (``Arrived.spec``).
"""
from __future__ import annotations

from typing import Dict, List, Set

from invariants.base import Checker, Violation
from overlapcheck.protocol import events as E


class SglangGolden(Checker):
    name = "sglang-golden"
    targets = ("sglang",)

    def __init__(self, golden=None, **context) -> None:
        super().__init__()
        self.golden = golden
        self.specs: Dict[int, object] = {}
        self.out: Dict[int, List[int]] = {}
        self.diverged: Set[int] = set()

    def _v(self, ev, rid: int, msg: str, expected: str, seen: str, kind: str) -> List[Violation]:
        self.diverged.add(rid)
        return [Violation(self.name, ev.iteration, f"request {rid}: {msg}", expected, seen,
                          (kind,), {"rid": rid, "batch": ev.batch})]

    def on_Arrived(self, ev: E.Arrived):
        covers = getattr(self.golden, "covers", None)
        if ev.spec is not None and (covers is None or covers(ev.spec)):
            self.specs[ev.rid] = ev.spec
            self.out[ev.rid] = []

    def _tokens(self, ev, rid: int, tokens) -> List[Violation]:
        spec = self.specs.get(rid)
        if self.golden is None or spec is None or rid in self.diverged:
            return []
        out = self.out[rid]
        for tok in tokens:
            want = self.golden.next(spec, list(spec.prompt) + out)
            if tok != want:
                return self._v(ev, rid, f"output token {len(out)} is not the model's continuation",
                               f"token {want} (the model after prompt + {len(out)} tokens)",
                               f"token {tok}", "token")
            out.append(tok)
        return []

    def on_Prefilled(self, ev: E.Prefilled):
        if ev.dropped or ev.token < 0:
            return []
        return self._tokens(ev, ev.rid, (ev.token,))

    def on_Verified(self, ev: E.Verified):
        if ev.dropped or self.golden is None or ev.rid in self.diverged:
            return []
        spec = self.specs.get(ev.rid)
        if spec is not None and getattr(self.golden, "k", 0) and self.out.get(ev.rid):
            ctx = list(spec.prompt) + self.out[ev.rid]
            want = self.golden.accept_len(spec, ctx)
            if want != ev.accept_len:
                return self._v(ev, ev.rid, f"accept length of verify #{ev.index} is not the "
                               f"model's", f"accept length {want} (draft vs target at "
                               f"{len(ctx)} tokens)", f"accept length {ev.accept_len}",
                               "accept-length")
        return self._tokens(ev, ev.rid, ev.tokens)
