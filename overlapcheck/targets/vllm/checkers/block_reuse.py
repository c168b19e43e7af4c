"""vllm-block-reuse: with unordered KV writers (deferred block frees on, as with a
KV-consumer connector), no KV block changes owner while a batch that writes it for its
previous owner is still in flight.

On a single GPU stream a block freed while batch N still writes it is safe to reuse:
the next writer runs after N. A KV-consumer connector breaks that order (its loads into
a newly allocated block are not ordered with the stream), which is why vLLM defers
those frees behind a fence (PR #45357). The vLLM target's runner reports the blocks
each batch writes (``VllmFrame``); a block ``Allocated`` to a request while an
unprocessed batch of another request writes it is a violation naming both. Idle unless
``VllmSessionInfo.unordered_writes``.
"""
from __future__ import annotations

from typing import Dict, List, Set

from invariants.base import Checker, Violation
from overlapcheck.protocol import events as E

from .. import events as V


class VllmBlockReuse(Checker):
    name = "vllm-block-reuse"
    targets = ("vllm",)

    def __init__(self, **context) -> None:
        super().__init__()
        # it reads the fake runner's frames; vLLM's own runner has none
        self.idle = context.get("vllm_runner") == "real"
        self.active = False
        self.writes: Dict[int, Dict[int, int]] = {}      # block -> {batch: writer rid}
        self.by_batch: Dict[int, Set[int]] = {}

    def on_VllmSessionInfo(self, ev: V.VllmSessionInfo):
        self.active = ev.unordered_writes

    def on_VllmFrame(self, ev: V.VllmFrame):
        if not self.active:
            return
        blocks = self.by_batch.setdefault(ev.batch, set())
        for e in ev.entries:
            for b in e.blocks:
                if b >= 0:
                    self.writes.setdefault(b, {})[ev.batch] = e.rid
                    blocks.add(b)

    def on_VllmFrameDone(self, ev: V.VllmFrameDone):
        for b in self.by_batch.pop(ev.batch, ()):
            w = self.writes.get(b)
            if w is not None:
                w.pop(ev.batch, None)
                if not w:
                    del self.writes[b]

    def on_Allocated(self, ev: E.Allocated) -> List[Violation]:
        if not self.active:
            return []
        out = []
        for s in ev.slots:
            for batch, rid in sorted(self.writes.get(s, {}).items()):
                if rid != ev.rid:
                    out.append(Violation(
                        self.name, ev.iteration, f"block {s} handed to request {ev.rid} while "
                        f"batch {batch} may still write it for request {rid}",
                        f"block {s} reused only after batch {batch} is processed",
                        f"allocated at step {ev.iteration}, batch {batch} unprocessed",
                        ("reuse-in-flight",), {"slot": s, "rid": ev.rid, "writer": rid,
                                               "batch": batch}))
                    break
        return out
