"""vllm-sched-after-end: no request is both ended and scheduled.

Once the vLLM target reported a request ``Finished`` or ``Aborted``, no later batch
(``Scheduled``) may carry it: its blocks are gone, and a batch that still computes it
writes KV it no longer owns and emits output nobody reads. Batches already in flight
at the end are fine (their results are dropped); only batches built after it count.
"""
from __future__ import annotations

from typing import Dict, List

from invariants.base import Checker, Violation
from overlapcheck.protocol import events as E


class VllmSchedAfterEnd(Checker):
    name = "vllm-sched-after-end"
    targets = ("vllm",)

    def __init__(self, **context) -> None:
        super().__init__()
        self.ended: Dict[int, str] = {}

    def on_Finished(self, ev: E.Finished):
        self.ended[ev.rid] = f"finished ({ev.reason}) at step {ev.iteration}"

    def on_Aborted(self, ev: E.Aborted):
        self.ended[ev.rid] = f"aborted at step {ev.iteration}"

    def on_Scheduled(self, ev: E.Scheduled) -> List[Violation]:
        out = []
        for rid in ev.rids:
            if rid in self.ended:
                out.append(Violation(self.name, ev.iteration, f"request {rid} scheduled in "
                                     f"batch {ev.batch} after it ended",
                                     "an ended request is in no later batch",
                                     f"it {self.ended[rid]}", ("scheduled-after-end",),
                                     {"rid": rid, "batch": ev.batch}))
        return out
