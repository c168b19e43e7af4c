"""The scheduler: FCFS admission, chunked prefill, decode batches with a draft KV
reserve, retraction under memory pressure. Host-side decisions only; it knows
committed lengths as the host knows them (through processed results).

A step's batch is a prefill batch when a prefill is in progress or a waiting request
can be admitted, else a decode batch.
"""
from __future__ import annotations

from bisect import bisect_left, insort
from typing import Dict, List, Optional

from ..protocol import events as E
from ..protocol.types import DECODE, PREFILL, PREFILLING, RUNNING, WAITING
from .accounting import Memory
from .config import EngineConfig
from .drafts import drafter_class
from .faults import FaultSet
from .memory import DECODE_PURPOSE, DRAFT_PURPOSE, PREFILL_PURPOSE, VERIFY_PURPOSE
from .types import Batch, Entry, Request


class Scheduler:
    def __init__(self, cfg: EngineConfig, mem: Memory, requests: Dict[int, Request], emit):
        self.cfg, self.mem, self.requests, self.emit = cfg, mem, requests, emit
        self.waiting: List[int] = []      # FCFS by (arrival, rid)
        self.admitted: List[int] = []     # prefilling or running, in admission order
        # left the waiting queue since ``take_dequeued`` (None: nobody asks, none kept)
        self.dequeued: Optional[List[int]] = None
        self.retractions = 0
        self.faults = FaultSet(cfg.faults)
        drafter = drafter_class(cfg.draft_kind) if cfg.spec else None
        #: ledger purpose of a decode step's reserve: ``decode`` without spec; ``draft``
        #: when the reserved slots hold target and draft KV of draft tokens; ``verify``
        #: when the draft has no KV of its own (they hold only the target KV the verify
        #: writes)
        self.decode_purpose = (DECODE_PURPOSE if drafter is None
                               else DRAFT_PURPOSE if drafter.owns_kv else VERIFY_PURPOSE)
        # zero bubble: a pre-drafted round's draft KV (none without draft KV)
        zb = cfg.zero_bubble and drafter is not None and drafter.owns_kv
        self._ahead = cfg.step_tokens if zb else 0

    # -- queues ---------------------------------------------------------------------------
    # The waiting queue is kept sorted by (arrival, rid), so that a request enters it and
    # leaves it by bisection: with every request of a large workload waiting at once, a
    # scan per arrival and per teardown made a run quadratic in its length.
    def enqueue(self, req: Request) -> None:
        insort(self.waiting, req.rid, key=self._key)

    def _key(self, rid: int):
        r = self.requests[rid]
        return (r.spec.arrival, r.rid)

    def forget(self, req: Request) -> None:
        if req.rid in self.admitted:          # max_running entries at most
            self.admitted.remove(req.rid)
        if self.waiting:
            i = bisect_left(self.waiting, self._key(req.rid), key=self._key)
            if i < len(self.waiting) and self.waiting[i] == req.rid:
                del self.waiting[i]
                if self.dequeued is not None:
                    self.dequeued.append(req.rid)

    def take_dequeued(self) -> List[int]:
        """The requests that left the waiting queue (admitted or torn down) since the last
        call, which starts keeping them (the engine's snapshot wakes them:
        ``Engine.snapshot``)."""
        out, self.dequeued = self.dequeued or [], []
        return out

    # -- decode reserve -------------------------------------------------------------------
    def reserve_tokens(self, req: Request) -> int:
        """Positions ``req`` must hold before its next decode: the device's committed
        length is at most ``committed + step * unprocessed``; the decode writes ``step``
        more, and with zero bubble its pre-draft of the next round writes draft KV one
        step further (``drafts_round``; clamped at the row end, where the next round is
        drafted at its own start instead)."""
        step = self.cfg.step_tokens
        if self.faults.on("reserve-past-row"):         # covers the lagged batch, unclamped
            return req.committed + step * (2 + req.unprocessed_decodes)
        if self.faults.on("reserve-host-view"):
            # fault: 1 + draft_len past the host's own committed length; the device is a
            # verify round ahead of it under overlap
            return min(req.committed + step + self._ahead, self.cfg.row_width)
        if self.cfg.tree:
            # tree drafts: a round of lag (k+1 committed at most per unprocessed verify),
            # then the tree's nodes (docs/design.md §4.12)
            return min(self.tree_reach(req, self._lag(req)) + self.cfg.num_draft_tokens,
                       self.cfg.row_width)
        if self.cfg.draft_reserve == "double":
            assert req.unprocessed_decodes <= 1, "double reserve assumes one batch of lag"
            need = req.committed + 2 * step
        else:
            need = req.committed + step * (1 + req.unprocessed_decodes)
        return min(need + self._ahead, self.cfg.row_width)

    def _lag(self, req: Request) -> int:
        """Unprocessed decodes the reserve covers: one (double) or those in flight."""
        if self.cfg.draft_reserve == "double":
            assert req.unprocessed_decodes <= 1, "double reserve assumes one batch of lag"
            return 1
        return req.unprocessed_decodes

    def tree_reach(self, req: Request, lag: int) -> int:
        """Tree drafts: the most positions ``req``'s committed KV reaches on the device
        after ``lag`` unprocessed verifies (each commits k+1 at most)."""
        return req.committed + (self.cfg.spec_steps + 1) * lag

    def _decodable(self) -> List[Request]:
        reqs = (self.requests[rid] for rid in self.admitted)
        return [r for r in reqs if r.state == RUNNING and not r.abort_requested]

    # -- batch building -------------------------------------------------------------------
    def build(self, it: int, bid: int) -> Optional[Batch]:
        batch = self._prefill(it, bid)
        if batch is None:
            batch = self._decode(it, bid)
        if batch is not None:
            for e in batch.entries:
                r = self.requests[e.rid]
                r.inflight.append(bid)
                if batch.kind == DECODE:
                    r.unprocessed_decodes += 1
            self.emit(E.Scheduled(it, bid, batch.kind, tuple(e.rid for e in batch.entries)))
        return batch

    def _prefill(self, it: int, bid: int) -> Optional[Batch]:
        budget, entries, cells = self.cfg.chunk_size, [], []
        for rid in self.admitted:
            r = self.requests[rid]
            if r.state == PREFILLING and not r.abort_requested and budget > 0:
                budget -= self._chunk(r, budget, entries)
        held = sum(self.mem.extra_pages(r, self.reserve_tokens(r)) for r in self._decodable())
        while budget > 0 and self.waiting and len(self.admitted) < self.cfg.max_running:
            r = self.requests[self.waiting[0]]
            if r.inflight or not self.mem.rows.can_allocate():
                break
            toks = r.tokens if not r.output else r.tokens[:-1]
            first = (self.cfg.spec_steps + 1 + self.cfg.num_draft_tokens if self.cfg.tree
                     else 2 * self.cfg.step_tokens)
            need = self.mem.kv.pages_for(len(toks) + first)
            node, shared = None, []
            if self.mem.tree is not None:    # prefix cache: reuse, evict for the rest
                node, shared = self.mem.hold_prefix(toks)
                need -= len(shared)
                self._evict(need + held, it, bid)
            if not self.mem.kv.can_allocate(need + held):
                if node is not None:
                    self.mem.drop_prefix(node)
                break
            self.waiting.pop(0)
            if self.dequeued is not None:
                self.dequeued.append(r.rid)
            self.admitted.append(r.rid)
            r.state, r.prefill_len, r.prefilled = PREFILLING, len(toks), 0
            self.mem.assign_row(r, it, bid)
            if shared:
                cells += self.mem.admit_prefix(r, node, shared, it, bid)
                r.prefilled = len(shared) * self.cfg.page_size
            elif node is not None:
                self.mem.drop_prefix(node)
            cells += self.mem.grow(r, len(toks), PREFILL_PURPOSE, it, bid)
            budget -= self._chunk(r, budget, entries)
        if not entries:
            return None
        return self._batch(bid, it, PREFILL, entries, cells)

    def _chunk(self, r: Request, budget: int, entries: List[Entry]) -> int:
        """Add ``r``'s next prefill chunk; returns its length."""
        n = min(budget, r.prefill_len - r.prefilled)
        start = r.prefilled
        last = start + n == r.prefill_len
        toks = tuple(r.tokens[start:start + n])
        sample = last and not r.output
        nxt = r.output[-1] if (last and r.output) else -1
        entries.append(Entry(r.rid, r.row, start, n, sample, last, nxt, toks,
                             r.shared * self.cfg.page_size))
        r.prefilled += n
        if last:
            r.state, r.committed = RUNNING, r.prefill_len
        return n

    def _decode(self, it: int, bid: int) -> Optional[Batch]:
        cands = self._decodable()
        purpose = self.decode_purpose
        kv = self.mem.kv

        def extra(r):
            return self.mem.extra_pages(r, self.reserve_tokens(r))

        if self.faults.on("preempt-behind-fence"):
            # fault: the retry expects each preemption to free pages at once, but a victim
            # riding the in-flight batch parks them behind it: the free count does not move
            # and the loop runs through the whole running queue, the last request included
            while cands and sum(map(extra, cands)) > kv.free_pages:
                self.retract(cands.pop(), it, bid)
        if self.mem.tree is not None:         # prefix cache: evict before retracting
            self._evict(sum(map(extra, cands)), it, bid)
        while len(cands) > 1 and sum(map(extra, cands)) > kv.free_pages + kv.pending_pages:
            victim = cands.pop()              # the newest admitted
            self.retract(victim, it, bid)
            if self.mem.tree is not None:     # its prefix may have become evictable
                self._evict(sum(map(extra, cands)), it, bid)
        entries, cells = [], []
        for r in cands:
            if kv.can_allocate(extra(r)):     # else it sits out until pending pages free
                cells += self.mem.grow(r, self.reserve_tokens(r), purpose, it, bid)
                entries.append(Entry(r.rid, r.row, shared=r.shared * self.cfg.page_size))
        if not entries:
            return None
        return self._batch(bid, it, DECODE, entries, cells)

    def _evict(self, pages: int, it: int, bid: int) -> None:
        """Prefix cache: evict cached pages so that free and pending-free pages hold
        ``pages`` (pending ones come back when the batch that may read them is processed)."""
        short = pages - self.mem.kv.free_pages - self.mem.kv.pending_pages
        if short > 0:
            self.mem.evict(short, it, bid)

    def _batch(self, bid: int, it: int, kind: str, entries: List[Entry], cells) -> Batch:
        slots, ps = {0}, self.mem.kv.page_size
        for e in entries:
            pages = self.requests[e.rid].pages
            if ps == 1:          # a page is its slot
                slots.update(pages)
            else:
                for p in pages:
                    slots.update(range(p * ps, (p + 1) * ps))
        if self.faults.on("declared-kv-slots-shrunk"):   # fault: declarations see slot 0 only
            slots = {0}
        return Batch(bid, it, kind, entries, cells, frozenset(slots))

    # -- retraction -----------------------------------------------------------------------
    def retract(self, r: Request, it: int, bid: int) -> None:
        """Send a running request back to waiting; its KV is freed (pending while an
        unprocessed batch may touch it). It re-prefills its tokens later."""
        self.admitted.remove(r.rid)
        committed = r.committed
        self.mem.release(r, "retract", it, bid)
        r.state, r.committed, r.prefilled, r.prefill_len = WAITING, 0, 0, 0
        r.retractions += 1
        self.retractions += 1
        self.enqueue(r)
        self.emit(E.Retracted(it, bid, r.rid, committed))
