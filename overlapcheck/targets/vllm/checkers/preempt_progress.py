"""vllm-preempt-progress: a preemption returns its victim's KV blocks to the pool now.

vLLM preempts a running request only to make room for another's allocation. When the
victim's blocks are fenced behind an in-flight batch (deferred block frees), the
preemption frees nothing this step: the allocation retry fails again and preempts the
next victim, a zero-progress cascade that under load becomes a preempt/re-add livelock
(vLLM issue #49674, vllm-ascend #16315; fixed by PR #49675, which stops the retry at a
fenced victim). A ``Freed`` with reason "retract" that is pending is that cascade's
first step, reported naming the victim and the batch its blocks wait for.
"""
from __future__ import annotations

from typing import List

from invariants.base import Checker, Violation
from overlapcheck.protocol import events as E


class VllmPreemptProgress(Checker):
    name = "vllm-preempt-progress"
    targets = ("vllm",)

    def __init__(self, **context) -> None:
        super().__init__()
        self.count = 0

    def on_Freed(self, ev: E.Freed) -> List[Violation]:
        if ev.reason != "retract" or not ev.pending:
            return []
        self.count += 1
        if self.count > 1:
            return []
        return [Violation(self.name, ev.iteration, f"preempted request {ev.rid}, whose "
                          f"{len(ev.slots)} blocks wait behind batch {ev.until}: the "
                          "preemption frees nothing now",
                          "a preemption victim's blocks return to the pool at once",
                          f"blocks parked until batch {ev.until} is processed",
                          ("zero-progress-preemption",), {"rid": ev.rid, "until": ev.until})]
