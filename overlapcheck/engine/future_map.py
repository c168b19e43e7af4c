"""Where a batch's next inputs live on the device: the FutureMap's index (docs/design.md §4.11).

A decode (or a prefill's last chunk) *stashes* each request's next input (the bonus
token, the committed length, and per draft kind the next draft input or a pre-drafted
round) in FutureMap buffers on the forward stream; the next batch that carries the
request *resolves* them there. The host never sees the values, only the index, which
it stages in the batch's metadata: per entry the slot to read (``src``) and the slot
to write (``dst``).

* ``row`` (``FutureRows``, the default): one slot per request-pool row; a request
  reads and writes its own row (``src == dst == row``), and the buffers change owner
  with the row.
* ``ring`` (``FutureRing``): SGLang's layout. Slots ``1..limit`` are handed out by a
  running counter modulo ``limit``; every entry of every batch takes the next one
  (a prefill chunk that ends nothing and the padding of a batch to its graph size
  take theirs too), writes there, and the request's next batch reads from it. A slot
  written for request r stays *pending* until the next batch carrying r is launched
  (its resolve is then ordered, on the forward stream, before any later write). The
  ring is sized as SGLang sizes it, ``max_running * (3 + chunks a prompt may take)``;
  since this engine can keep a request out of batches for longer than that (a run of
  admissions, a request sitting out its reserve), the counter also steps over the
  slots still pending, so a pending next input is never overwritten.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

from ..protocol.types import PREFILL, RUNNING
from .config import EngineConfig
from .faults import FaultSet
from .types import Batch


def future_slots(cfg: EngineConfig) -> int:
    """Slots of every FutureMap buffer: the request-pool rows, or the ring's."""
    if cfg.future_map != "ring":
        return cfg.max_running
    return ring_limit(cfg) + 1               # slot 0 is never handed out


def ring_limit(cfg: EngineConfig) -> int:
    """The ring's counter modulus: SGLang's ``max_running * (3 + max_num_chunks)``."""
    return cfg.max_running * (3 + -(-cfg.max_context // cfg.chunk_size))


class FutureRows:
    """The FutureMap indexed by request-pool row."""

    ring = False

    def __init__(self, cfg: EngineConfig, requests):
        self.size = cfg.max_running
        self.assigned = 0                    # the ring's count: none here

    def assign(self, batch: Batch) -> List[Tuple[int, int]]:
        return [(e.row, e.row) for e in batch.entries]


def padded(n: int, cap: int) -> int:
    """A batch of ``n`` entries padded to its graph size: the next power of two, at most
    ``cap`` (the largest batch)."""
    size = 1
    while size < n:
        size *= 2
    return max(n, min(size, cap))


class FutureRing:
    """The FutureMap as a ring of slots handed out by a running counter (SGLang's)."""

    ring = True

    def __init__(self, cfg: EngineConfig, requests):
        self.requests = requests
        self.cap = cfg.max_running
        self.limit = ring_limit(cfg)
        self.size = future_slots(cfg)
        self.counter = 0                     # the last slot handed out
        self.assigned = 0                    # batches given ring slots
        self.pending: Dict[int, int] = {}    # rid -> the slot holding its next input
        self.faults = FaultSet(cfg.faults)

    def _busy(self) -> set:
        """Slots holding a next input some running request has yet to read (the
        others' entries are dropped: a request torn down, retracted or re-prefilling
        reads none of its old slot)."""
        reqs = self.requests
        self.pending = {rid: s for rid, s in self.pending.items()
                        if reqs[rid].state == RUNNING}
        return set(self.pending.values())

    def _take(self, n: int, busy: set, limit: int) -> List[int]:
        out = []
        while len(out) < n:
            self.counter = self.counter % limit + 1
            if self.counter not in busy:
                out.append(self.counter)
        return out

    def assign(self, batch: Batch) -> List[Tuple[int, int]]:
        """Per entry, (slot to read, slot to write); the batch takes its padded size in
        slots. A prefill entry reads nothing (its src is its dst)."""
        entries = batch.entries
        busy = self._busy()      # this batch's own readers' slots included
        src = [self.pending.get(e.rid, 0) for e in entries]
        limit = self.limit
        if self.faults.on("ring-slot-alias"):
            # fault: the ring sized for running batches only (not their chunks), and its
            # size trusted: the counter hands out slots still pending
            limit, busy = 3 * self.cap, set()
        slots = self._take(padded(len(entries), self.cap), busy, limit)
        self.assigned += 1
        out = []
        for e, s, d in zip(entries, src, slots):
            if batch.kind != PREFILL:
                out.append((s, d))
                self.pending[e.rid] = d
            else:
                out.append((d, d))
                if e.last:
                    self.pending[e.rid] = d
        return out


def make_future_map(cfg: EngineConfig, requests):
    return FutureRing(cfg, requests) if cfg.future_map == "ring" else FutureRows(cfg, requests)
