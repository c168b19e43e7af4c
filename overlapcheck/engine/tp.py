"""Tensor-parallel ranks for fuzzing: N logical ranks in one process on the sim.

Every rank is a whole ``Engine`` (its own scheduler, memory, worker and device state:
streams and buffers of its own) on the one sim runtime, so one seed and one recorded
list of schedule choices drive all ranks, and a run replays exactly. Rank 0 is the
``TPEngine`` itself: its events go to the observer and its results are the run's, so
``tp=2`` gives the same tokens as ``tp=1``. The other ranks are silent, except for
their scheduling decision each step (``RankBatch``, checked by ``rank-agreement``).

A step runs in two phases, as concurrent ranks would: every rank builds and launches
its batch (``begin_step``), then every rank processes results (``end_step``, rank 0
last, so its ``StepEnd`` closes the step). The n-th batch each rank launches joins
all-reduce n (``Collective``): the copy of its results waits for a host flag the last
rank to join sets. A rank that never joins leaves the others' result copies stuck;
the host wait on them raises the sim's ``StuckWait``, naming the all-reduce and the
missing ranks, and the engine reports ``Stalled`` (a liveness finding, never a hang).
In-step host syncs wait on the forward stream, which the all-reduce does not gate.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional

from ..protocol import events as E
from .faults import FaultSet
from .config import EngineConfig
from .loop import Engine
from .types import Batch


class Collective:
    """The ranks' all-reduce of each batch's results, modelled with sim host flags."""

    def __init__(self, rt, tp: int):
        self.rt, self.tp = rt, tp
        self.joined = [0] * tp                    # per rank: all-reduces joined so far
        self.open: Dict[int, tuple] = {}          # all-reduce n -> (flag, {rank: batch id})

    def join(self, eng: Engine, batch: Batch) -> None:
        """``eng``'s rank joins its next all-reduce with ``batch``: the copy stream's
        later work (this batch's result copies and copy-done) waits until all ranks did."""
        n = self.joined[eng.rank]
        self.joined[eng.rank] += 1
        flag, who = self.open.setdefault(n, (self.rt.new_flag(""), {}))
        who[eng.rank] = batch.bid
        missing = [r for r in range(self.tp) if r not in who]
        flag.name = (f"all-reduce {n} of batch {batch.bid}: joined by rank(s) "
                     f"{sorted(who)}, never by rank(s) {missing}")
        self.rt.wait_flag(eng.dev.copy, flag)
        if not missing:
            flag.set()
            del self.open[n]


class TPEngine(Engine):
    """``cfg.tp`` logical ranks; this object is rank 0 (see the module docstring)."""

    def __init__(self, cfg: EngineConfig, rt, model, observer: Optional[E.Observer] = None,
                 strict: bool = False):
        if not hasattr(rt, "new_flag"):
            raise ValueError("logical tensor-parallel ranks run on the sim device "
                             "(real ranks: overlapcheck run --dist)")
        super().__init__(cfg, rt, model, observer, strict)
        self.collective = Collective(rt, cfg.tp)
        self.others: List[Engine] = []
        for r in range(1, cfg.tp):
            eng = Engine(cfg, rt, model, None, strict, canary=self.canary)   # launches alike
            eng.rank, eng.collective = r, self.collective
            self.others.append(eng)

    @property
    def ranks(self) -> List[Engine]:
        return [self] + self.others

    @property
    def idle(self) -> bool:
        return all(Engine.idle.fget(r) for r in self.ranks)

    def add(self, spec) -> None:
        super().add(spec)
        for r in self.others:
            r.add(spec)

    def abort(self, rid: int) -> None:
        super().abort(rid)
        for r in self.others:
            r.abort(rid)

    def step(self) -> None:
        batches = [r.begin_step() for r in self.ranks]
        for r, b in zip(self.ranks, batches):
            self._emit(rank_batch(self.iteration, r.rank, b, r.overlapping))
        for r, b in reversed(list(zip(self.ranks, batches))):
            r.end_step(b)

    def _declared(self) -> int:
        return sum(r.worker.declared_syncs for r in self.ranks)

    def snapshot(self) -> E.Snapshot:
        """Rank 0's state; host syncs are counted over the shared runtime, so the
        declared ones are too; ``ran`` counts the ranks that launched a batch (``tp``: a
        rank of its own process, ``--dist``, counts none)."""
        snap = super().snapshot()
        ranks = sum(r.batches > 0 for r in self.ranks)
        return dataclasses.replace(snap, declared_syncs=self._declared(),
                                   ran=tuple(sorted(snap.ran + (("tp", ranks),))))

    def result(self):
        res = super().result()
        return dataclasses.replace(res, summary=dataclasses.replace(
            res.summary, declared_syncs=self._declared()))


def rank_batch(iteration: int, rank: int, batch: Optional[Batch], overlap: bool) -> E.RankBatch:
    """The ``RankBatch`` event of ``rank``'s decision (``batch`` None: it launched none)."""
    if batch is None:
        return E.RankBatch(iteration, -1, rank, "none", (), overlap)
    return E.RankBatch(iteration, batch.bid, rank, batch.kind,
                       tuple(e.rid for e in batch.entries), overlap)


def make_engine(cfg: EngineConfig, rt, model, observer: Optional[E.Observer] = None,
                strict: bool = False) -> Engine:
    """The engine for ``cfg``: a ``TPEngine`` when ``cfg.tp > 1``, else an ``Engine``."""
    cls = TPEngine if cfg.tp > 1 else Engine
    if FaultSet(cfg.faults).on("forward-thread-skipped"):
        cls = TPEngine    # fault: one rank runs as one-rank tensor parallel (no forward thread)
    return cls(cfg, rt, model, observer, strict)
