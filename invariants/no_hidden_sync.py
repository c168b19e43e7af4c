"""no-hidden-sync: a step makes no host synchronization beyond the declared ones (the
copy-done wait of each processed result). The runtime counts host syncs (sim: every
blocking call; cuda: every synchronize / blocking copy it issues); the snapshot carries
both counters."""
from __future__ import annotations

from typing import List

from overlapcheck.protocol import events as E

from .base import Checker, Violation


class NoHiddenSync(Checker):
    name = "no-hidden-sync"
    targets = ("reference",)    # reads what only the reference engine emits

    def __init__(self, **context) -> None:
        super().__init__()
        self.last = (0, 0)

    def on_StepEnd(self, ev: E.StepEnd) -> List[Violation]:
        snap = ev.snapshot
        syncs, declared = snap.syncs - self.last[0], snap.declared_syncs - self.last[1]
        self.last = (snap.syncs, snap.declared_syncs)
        if syncs > declared:
            return [Violation(self.name, ev.iteration, f"{syncs - declared} hidden host sync(s) "
                              f"in step {ev.iteration}", f"{declared} host sync(s) (the declared "
                              f"copy-done waits)", f"{syncs} host sync(s)", ("hidden-sync",),
                              {"syncs": syncs, "declared": declared})]
        return []
