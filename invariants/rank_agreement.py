"""rank-agreement: every tensor-parallel rank takes the same scheduling decision each
step: the same batch kind and requests (in batch order), the same overlap decision
and the same batch number (the n-th batch of each rank joins the n-th collective).

The engine emits one ``RankBatch`` per rank and step, rank 0 first; each other rank's
decision is compared with rank 0's of the same step. Ranks that disagree issue
different collectives (different shapes, or one that some rank never joins): on a GPU
machine that is a hang, so the disagreement is reported where it starts, once per run:
after it the ranks' states differ and later disagreements are its consequences. The
site is the first field that differs (``kind``, ``rids``, ``overlap``, ``batch``). A
single-rank run emits no ``RankBatch`` and is never checked.
"""
from __future__ import annotations

from typing import List, Optional

from overlapcheck.protocol import events as E

from .base import Checker, Violation

FIELDS = ("kind", "rids", "overlap", "batch")


def describe(ev: E.RankBatch) -> str:
    """One rank's decision in words (both facts of a violation use it)."""
    if ev.kind == "none":
        return f"rank {ev.rank}: no batch"
    return (f"rank {ev.rank}: {ev.kind} batch {ev.batch} of requests {list(ev.rids)}, "
            f"{'overlapped' if ev.overlap else 'not overlapped'}")


class RankAgreement(Checker):
    name = "rank-agreement"
    targets = ("reference",)    # reads what only the reference engine emits

    def __init__(self, **context) -> None:
        super().__init__()
        self.ref: Optional[E.RankBatch] = None    # rank 0's decision of the current step
        self.diverged = False                      # a disagreement was reported

    def on_RankBatch(self, ev: E.RankBatch) -> List[Violation]:
        if ev.rank == 0:
            self.ref = ev
            return []
        if self.diverged:
            return []
        ref = self.ref
        if ref is None or ref.iteration != ev.iteration:
            return [self._missing(ev)]
        diff = [f for f in FIELDS if getattr(ev, f) != getattr(ref, f)]
        if not diff:
            return []
        self.diverged = True
        return [Violation(
            self.name, ev.iteration, f"rank {ev.rank} and rank 0 disagree at step "
            f"{ev.iteration} on {', '.join(diff)}", describe(ref), describe(ev), (diff[0],),
            {"rank": ev.rank, "fields": diff, "rank0": _facts(ref), "other": _facts(ev)})]

    def _missing(self, ev: E.RankBatch) -> Violation:
        self.diverged = True
        return Violation(self.name, ev.iteration, f"rank {ev.rank} reported a decision at "
                         f"step {ev.iteration} without rank 0", "rank 0's decision first",
                         describe(ev), ("rank0",), {"rank": ev.rank})


def _facts(ev: E.RankBatch) -> dict:
    return {"rank": ev.rank, "batch": ev.batch, "kind": ev.kind, "rids": list(ev.rids),
            "overlap": ev.overlap}
