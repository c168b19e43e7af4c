"""vllm-golden: every token the vLLM scheduler keeps is the fake model's own token for
that position, and every accept length is the exact one its drafts earn.

The vLLM target's fake model is a pure function (``overlapcheck/targets/vllm/golden.py``):
the token at position p is a hash of the request's seed and its tokens before p, a draft
agrees with it by a seeded hash. So this oracle needs no reference run: from
``Arrived.spec`` it recomputes the token at each kept position (a token duplicated,
dropped or delivered to the wrong place shows at once), and for each kept verify the
accept length its batch's drafts must give (``VllmFrame``: draft count and source; pads
and stale draft slots can only be rejected). Parity compares two runs; this compares a
run with the model, so a bug that both schedules share is caught too.
"""
from __future__ import annotations

from typing import Dict, List, Set, Tuple

from invariants.base import Checker, Violation
from overlapcheck.protocol import events as E
from overlapcheck.protocol.types import SEEDED

from .. import events as V
from ..golden import Golden


class VllmGolden(Checker):
    name = "vllm-golden"
    targets = ("vllm",)

    def __init__(self, **context) -> None:
        super().__init__()
        # it reads the fake runner's frames; vLLM's own runner has none
        self.idle = context.get("vllm_runner") == "real"
        self.vocab, self.agreement = 64, 70
        self.gold: Dict[int, Golden] = {}
        self.plen: Dict[int, int] = {}
        self.kept: Dict[int, int] = {}
        self.entries: Dict[Tuple[int, int], V.FrameEntry] = {}
        self.noted: Set[int] = set()

    def on_VllmSessionInfo(self, ev: V.VllmSessionInfo):
        self.vocab, self.agreement = ev.vocab, ev.agreement

    def on_Arrived(self, ev: E.Arrived):
        s = ev.spec
        if s is not None:
            self.gold[ev.rid] = Golden(s.prompt, s.seed, s.sampling == SEEDED, self.vocab,
                                       self.agreement)
            self.plen[ev.rid] = len(s.prompt)
            self.kept[ev.rid] = 0

    def on_VllmFrame(self, ev: V.VllmFrame):
        for e in ev.entries:
            self.entries[(ev.batch, e.rid)] = e

    def on_VllmFrameDone(self, ev: V.VllmFrameDone):
        for key in [k for k in self.entries if k[0] == ev.batch]:
            del self.entries[key]

    def _v(self, ev, rid: int, kind: str, msg: str, expected: str, seen: str) -> List[Violation]:
        if rid in self.noted:
            return []
        self.noted.add(rid)
        return [Violation(self.name, ev.iteration, f"request {rid}: {msg}", expected, seen,
                          (kind,), {"rid": rid, "batch": ev.batch})]

    def _tokens(self, ev, rid: int, tokens) -> List[Violation]:
        g = self.gold.get(rid)
        if g is None or rid in self.noted:
            return []
        q = self.plen[rid] + self.kept[rid]
        self.kept[rid] += len(tokens)
        for i, t in enumerate(tokens):
            want = g.token(q + i)
            if t != want:
                return self._v(ev, rid, "token", f"output token {q + i - self.plen[rid]} is not "
                               "the model's", f"token {want} at position {q + i}",
                               f"token {t} (batch {ev.batch})")
        return []

    def on_Prefilled(self, ev: E.Prefilled):
        if ev.dropped or ev.token < 0:
            return []
        return self._tokens(ev, ev.rid, (ev.token,))

    def on_Verified(self, ev: E.Verified):
        if ev.dropped:
            return []
        g, e = self.gold.get(ev.rid), self.entries.get((ev.batch, ev.rid))
        out: List[Violation] = []
        if g is not None and e is not None and ev.rid not in self.noted:
            q = self.plen[ev.rid] + self.kept[ev.rid]
            want = len(g.verify(q, g.drafts(q, e.spec))) if e.drafts == "fresh" else 1
            if ev.accept_len != want:
                out += self._v(ev, ev.rid, "accept-length", f"verify #{ev.index} accepted "
                               "other than its drafts earn", f"accept length {want} "
                               f"({e.spec} {e.drafts} drafts at position {q})",
                               f"accept length {ev.accept_len}")
        return out + self._tokens(ev, ev.rid, ev.tokens)
