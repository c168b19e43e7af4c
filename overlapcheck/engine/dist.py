"""One real tensor-parallel rank (``overlapcheck run --tp N --dist``; the processes
are started by ``overlapcheck.run.dist``).

Each rank runs the whole engine on its own runtime from the same seed; after each
step's launch the ranks all-gather their decisions (batch kind, requests, overlap) in
a ``torch.distributed`` group. Rank 0 emits every rank's decision as ``RankBatch``
events, so ``rank-agreement`` compares the ranks. A collective that fails or times
out (a rank died or never came) raises ``CollectiveFailed``, a ``StuckWait``: the
engine reports it as ``Stalled`` and liveness names it.

Test hook: ``OVERLAPCHECK_DIST_EXIT=RANK:STEP`` makes RANK exit (code 17) at STEP.
"""
from __future__ import annotations

import os
import re
from typing import Optional

import torch

from ..device import StuckWait
from ..protocol import events as E
from ..protocol.types import DECODE, PREFILL
from .loop import Engine
from .tp import rank_batch

EXIT_ENV, EXIT_CODE = "OVERLAPCHECK_DIST_EXIT", 17
KINDS = ("none", PREFILL, DECODE)


class CollectiveFailed(StuckWait):
    """A collective that can never complete: some rank died, left or never came."""

    def __init__(self, what: str, error: str):
        RuntimeError.__init__(self, f"{what} can never complete: a rank never joined it "
                                    f"({_short(error)})")
        self.host_wait, self.stream, self.waits_for = what, "collective", "every rank"


def _short(error: str) -> str:
    """The gist of a backend error: its first line, without a source location prefix
    or the advice that follows."""
    line = (error.strip().splitlines() or ["?"])[0]
    return re.sub(r"^\[[^\]]*\]\s*", "", line).split(". ")[0]


class DistRank(Engine):
    """One real rank: each step, all-gather the ranks' decisions between launch and
    result processing; rank 0 emits them as ``RankBatch`` events."""

    exit_at: Optional[int] = None    # the test hook's step for this rank

    def step(self) -> None:
        import torch.distributed as dist
        if self.iteration == self.exit_at:
            os._exit(EXIT_CODE)
        batch = self.begin_step()
        mine = _encode(rank_batch(self.iteration, self.rank, batch, self.overlapping),
                       self.cfg.max_running)
        if dist.get_backend() == "nccl":
            mine = mine.cuda()
        got = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
        try:
            dist.all_gather(got, mine)
        except RuntimeError as e:
            raise CollectiveFailed(f"all-gather of step {self.iteration}'s batch decisions",
                                   str(e)) from None
        for rank, t in enumerate(got):
            self._emit(_decode(t.cpu(), rank))
        self.end_step(batch)


def _encode(ev: E.RankBatch, width: int) -> torch.Tensor:
    rids = list(ev.rids) + [-1] * (width - len(ev.rids))
    return torch.tensor([ev.iteration, ev.batch, KINDS.index(ev.kind), int(ev.overlap),
                         len(ev.rids)] + rids, dtype=torch.int64)


def _decode(t: torch.Tensor, rank: int) -> E.RankBatch:
    v = t.tolist()
    return E.RankBatch(v[0], v[1], rank, KINDS[v[2]], tuple(v[5:5 + v[4]]), bool(v[3]))


def exit_step(rank: int) -> Optional[int]:
    """The test hook's step for ``rank`` (``OVERLAPCHECK_DIST_EXIT=RANK:STEP``)."""
    hook = os.environ.get(EXIT_ENV, "").split(":")
    ok = len(hook) == 2 and hook[0] == str(rank) and hook[1].isdigit()
    return int(hook[1]) if ok else None
