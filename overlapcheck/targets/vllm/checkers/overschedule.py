"""vllm-overschedule: no request is scheduled once the batches already in flight are
sure to bring it to ``max_tokens``.

Each unprocessed batch that samples for a request emits at least one token (all its
drafts may be rejected); with ``kept`` tokens delivered and ``f`` such batches in
flight, the request certainly reaches ``kept + f`` tokens. Scheduling it again when
``kept + f >= max_tokens`` spends KV blocks and a batch slot on output that is thrown
away, and can preempt others (vLLM PR #27922 added the async scheduler's check).
Reads ``Arrived`` (limits), ``VllmFrame``/``VllmFrameDone`` and the kept tokens of
``Prefilled``/``Verified``.
"""
from __future__ import annotations

from typing import Dict, List, Set

from invariants.base import Checker, Violation
from overlapcheck.protocol import events as E

from .. import events as V


class VllmOverschedule(Checker):
    name = "vllm-overschedule"
    targets = ("vllm",)

    def __init__(self, **context) -> None:
        super().__init__()
        # it reads the fake runner's frames; vLLM's own runner has none
        self.idle = context.get("vllm_runner") == "real"
        self.limit: Dict[int, int] = {}
        self.kept: Dict[int, int] = {}
        self.flying: Dict[int, int] = {}                 # rid -> in-flight sampling batches
        self.frames: Dict[int, List[int]] = {}           # batch -> sampling rids
        self.noted: Set[int] = set()

    def on_Arrived(self, ev: E.Arrived):
        if ev.spec is not None:
            self.limit[ev.rid] = ev.spec.max_new_tokens
        self.kept[ev.rid] = 0

    def on_Prefilled(self, ev: E.Prefilled):
        if not ev.dropped and ev.token >= 0:
            self.kept[ev.rid] = self.kept.get(ev.rid, 0) + 1

    def on_Verified(self, ev: E.Verified):
        if not ev.dropped:
            self.kept[ev.rid] = self.kept.get(ev.rid, 0) + len(ev.tokens)

    def on_VllmFrame(self, ev: V.VllmFrame) -> List[Violation]:
        out = []
        for e in ev.entries:
            sure = self.kept.get(e.rid, 0) + self.flying.get(e.rid, 0)
            limit = self.limit.get(e.rid)
            if limit is not None and sure >= limit and e.rid not in self.noted:
                self.noted.add(e.rid)
                out.append(Violation(
                    self.name, ev.iteration, f"request {e.rid} scheduled in batch {ev.batch} "
                    f"after its max_tokens ({limit}) was already certain",
                    f"not scheduled once kept + in-flight sampling batches >= {limit}",
                    f"{self.kept.get(e.rid, 0)} kept + {self.flying.get(e.rid, 0)} in flight, "
                    f"{e.n} more tokens scheduled", ("past-max-tokens",), {"rid": e.rid}))
        rids = [e.rid for e in ev.entries if e.samples]
        self.frames[ev.batch] = rids
        for rid in rids:
            self.flying[rid] = self.flying.get(rid, 0) + 1
        return out

    def on_VllmFrameDone(self, ev: V.VllmFrameDone):
        for rid in self.frames.pop(ev.batch, ()):
            self.flying[rid] -= 1
