"""Memory accounting: KV pages and request-pool rows, their device ownership
(``rt.transfer`` on every change of owner) and the events that report them.

The one place that moves memory between requests; the scheduler and the result
processing call it.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Tuple

from ..protocol import events as E
from ..protocol.types import LENGTH, STOP
from .config import EngineConfig
from .faults import FaultSet
from .memory import BACKUP_PURPOSE, PREFILL_PURPOSE, KVPool, RowPool
from .radix import RadixCache, pair_keys
from .types import Request


class Memory:
    def __init__(self, cfg: EngineConfig, dev, emit: Callable[[E.Event], None]):
        self.cfg, self.dev, self.emit = cfg, dev, emit
        self.kv = KVPool(cfg)
        self.rows = RowPool(cfg.max_running)
        self.ps = cfg.page_size
        self.faults = FaultSet(cfg.faults)
        # the KV backup's host pool: as many pages as the device pool, allocated with a
        # request's device pages and released with them (its own ledger)
        self.host = KVPool(cfg) if cfg.kv_backup else None
        self._host_cells: List[Tuple[int, int, int]] = []
        # the radix prefix cache (docs/design.md §4.13), and the newest processed batch
        # (batches are processed in launch order): a cached page whose fence is newer
        # may still be read by a batch in flight
        self.tree = RadixCache(cfg.page_size) if cfg.prefix_cache else None
        self.done = -1
        self.hits = 0       # admissions that reused a cached prefix (the snapshot's ``ran``)

    def _slots(self, pages: List[int]) -> Tuple[int, ...]:
        if self.kv.page_size == 1:     # a page is its slot
            return tuple(pages)
        return tuple(s for p in pages for s in self.kv.slots(p))

    # -- rows -----------------------------------------------------------------------------
    def assign_row(self, req: Request, it: int, bid: int) -> int:
        req.row = self.rows.allocate(req.rid)
        self.dev.transfer_row(req.row, req.rid)
        self.emit(E.RowAssigned(it, bid, req.rid, req.row))
        return req.row

    # -- KV -------------------------------------------------------------------------------
    def extra_pages(self, req: Request, tokens: int) -> int:
        """Pages ``req`` still needs to hold ``tokens`` positions."""
        return max(0, self.kv.pages_for(tokens) - len(req.pages))

    def grow(self, req: Request, tokens: int, purpose: str, it: int, bid: int
             ) -> List[Tuple[int, int, int]]:
        """Allocate pages so that ``req`` holds ``tokens`` positions; returns the
        request->token cells (row, position, slot) to write."""
        n = self.extra_pages(req, tokens)
        if n == 0:
            return []
        first = len(req.pages)
        pages = self.kv.allocate(n, req.rid, purpose, it)
        req.pages.extend(pages)
        slots = self._slots(pages)
        self.dev.transfer_slots(slots, req.rid)
        self.emit(E.Allocated(it, bid, req.rid, purpose, slots, req.row))
        base = first * self.ps
        if self.host is not None:
            hpages = self.host.allocate(n, req.rid, BACKUP_PURPOSE, it)
            req.host_pages.extend(hpages)
            hslots = self._slots(hpages)
            self.dev.transfer_host_slots(hslots, req.rid)
            self._host_cells += [(req.row, base + i, s) for i, s in enumerate(hslots)]
        return [(req.row, base + i, s) for i, s in enumerate(slots)]

    # -- the prefix cache (docs/design.md §4.13) ---------------------------------------------
    def hold_prefix(self, toks) -> tuple:
        """Match the longest cached prefix of a prefill's tokens (all but the last: the
        prefill must compute one position to sample from) and lock it, so that an
        eviction for this admission cannot take it; returns (node, pages)."""
        self._locks_changing()      # a match may split a node
        node, pages = self.tree.match(pair_keys(toks, len(toks) - 1))
        self.tree.lock(node)
        return node, pages

    def drop_prefix(self, node) -> None:
        """Undo ``hold_prefix`` of an admission that did not happen (nothing read it)."""
        self._locks_changing()
        self.tree.unlock(node, -1)

    def _locks_changing(self) -> None:
        """Snapshot views of the lock counts and the tree's nodes read as they were
        before a lock or a node changes."""
        if self.kv._views:
            self.kv._changing()

    def admit_prefix(self, req: Request, node, pages: List[int], it: int, bid: int
                     ) -> List[Tuple[int, int, int]]:
        """``req`` (row assigned) reuses the held prefix: its first pages are the tree's;
        returns the request->token cells to write for them."""
        req.prefix_node, req.shared, req.pages = node, len(pages), list(pages)
        self.hits += 1
        slots = self._slots(pages)
        self.emit(E.PrefixLocked(it, bid, req.rid, slots))
        return [(req.row, i, s) for i, s in enumerate(slots)]

    def evict(self, n: int, it: int, bid: int) -> None:
        """Evict unlocked cached pages (least recently used leaves) until ``n`` went or
        none is left; a page a batch in flight may read is pending-free behind it."""
        self._locks_changing()
        for pages, fence in self.tree.evict(n):
            until = fence if fence > self.done else None
            slots = self._slots(pages)
            if self.kv.uncache(pages, until):
                self.dev.transfer_slots(slots, None)
            self.emit(E.Evicted(it, bid, slots, until is not None, until))

    def _leave_tree(self, req: Request, reason: str, until, it: int, bid: int) -> None:
        """A finished request's committed KV goes to the tree (pages the tree already
        held are duplicates, freed with the rest); its prefix lock is released. Leaves
        in ``req.pages`` the request's own pages still to release."""
        fence = -1 if until is None else until
        ps, shared = self.ps, req.shared
        own = req.pages[shared:]
        if reason in (STOP, LENGTH):
            toks = req.tokens
            # positions whose KV holds the request's tokens (a stop cut may leave
            # accepted KV past the kept output) and whose next token is known
            n = min(req.committed, len(toks) - 1, len(req.pages) * ps) // ps * ps
            if n > shared * ps:
                cand = req.pages[:n // ps]
                if self.faults.on("radix-node-overcovers") and len(req.pages) > n // ps:
                    # fault: the page past the last whole page of the key goes too
                    cand = req.pages[:n // ps + 1]
                self._locks_changing()
                have = self.tree.insert(pair_keys(toks, n), cand, fence) // ps
                new = cand[max(have, shared):]
                if new:
                    self.kv.cache(new, req.rid)
                    self.emit(E.Cached(it, bid, req.rid, self._slots(new)))
                    gone = set(new)
                    own = [p for p in own if p not in gone]
        node = req.prefix_node
        if node is not None:
            late = until is not None and reason in (STOP, LENGTH)
            if not (late and self.faults.on("lock-late-finish")):
                # fault lock-late-finish: a finish processed one step late (the request
                # rides the lagged batch) never releases its prefix lock
                self._locks_changing()
                self.tree.unlock(node, fence)
                self.emit(E.PrefixReleased(it, bid, req.rid, self._slots(req.pages[:shared]),
                                           until))
        req.pages, req.shared, req.prefix_node = own, 0, None

    def take_host_cells(self) -> List[Tuple[int, int, int]]:
        """The request->host-pool cells allocated since the last call (for the launch)."""
        cells, self._host_cells = self._host_cells, []
        return cells

    def host_slots(self, reqs) -> frozenset:
        return frozenset(s for r in reqs for s in self._slots(r.host_pages))

    def release(self, req: Request, reason: str, it: int, bid: int) -> None:
        """Take all memory away from ``req``: its KV pages (pending-free until the
        newest batch it rides is processed) and its row (free at once)."""
        until = max(req.inflight) if req.inflight else None
        if self.tree is not None:
            self._leave_tree(req, reason, until, it, bid)
        pages = self._release_range(req, reason, until)
        slots = self._slots(pages)
        freed = self.kv.release(pages, req.rid, until)
        if freed:
            self.dev.transfer_slots(slots, None)
        self.emit(E.Freed(it, bid, req.rid, slots, reason, until is not None, until))
        req.pages = []
        if self.host is not None and req.host_pages:
            if self.host.release(req.host_pages, req.rid, until):
                self.dev.transfer_host_slots(self._slots(req.host_pages), None)
            req.host_pages = []
        if req.row is not None:
            self.rows.release(req.row, req.rid)
            if until is not None and self.faults.on("phantom-pool-row"):
                # fault: the row of a request torn down in flight goes back a second
                # time, at the bottom of the free stack (admission never reaches it)
                self.rows.free.insert(0, req.row)
            self.dev.transfer_row(req.row, None)
            self.emit(E.RowReleased(it, bid, req.rid, req.row))
            req.row = None

    def _release_range(self, req: Request, reason: str, until) -> List[int]:
        """The pages a release frees: all of ``req``'s pages. Each guarded site below is a
        bug-zoo fault that computes the range another way and strands the rest."""
        pages, ps = req.pages, self.ps
        if self.faults.on("unaligned-tail-free"):      # committed floor-divided, tail in pages
            c = min(req.committed, len(pages) * ps)
            pages = pages[:c // ps + (len(pages) * ps - c) // ps]
        if self.faults.on("retract-inferred-free") and reason == "retract":
            pages = pages[:self.kv.pages_for(len(req.tokens))]   # inferred, not allocated
        if self.faults.on("teardown-skips-draft") and until is not None and self.cfg.spec:
            pages = [p for p in pages if self.kv.owned[p].purpose == PREFILL_PURPOSE]
        return pages

    def trim(self, req: Request, keep: int, it: int, bid: int) -> None:
        """Tree drafts (docs/design.md §4.12), after a verify's result: release ``req``'s
        pages wholly past its first ``keep`` positions (they held the rejected branches'
        KV; pending-free while a batch it rides may still write there). The next decode
        grows the reserve back."""
        first = self.kv.pages_for(keep)
        pages = req.pages[first:]
        if not pages:
            return
        req.pages = req.pages[:first]
        if self.faults.on("tree-branch-kv-leak"):
            # fault: the freed range is the chain's (k+1 positions past ``keep``, as a
            # topk-1 verify would have written); the rest of the tree's pages are dropped
            # from the request without being freed
            pages = pages[:max(0, self.kv.pages_for(keep + self.cfg.spec_steps + 1) - first)]
        until = max(req.inflight) if req.inflight else None
        slots = self._slots(pages)
        if pages:
            if self.kv.release(pages, req.rid, until):
                self.dev.transfer_slots(slots, None)
            self.emit(E.Freed(it, bid, req.rid, slots, "tree", until is not None, until))
        hfirst = first - req.shared     # host pages back the request's own pages only
        if self.host is not None and len(req.host_pages) > hfirst:
            hpages, req.host_pages = req.host_pages[hfirst:], req.host_pages[:hfirst]
            if self.host.release(hpages, req.rid, until):
                self.dev.transfer_host_slots(self._slots(hpages), None)

    def on_processed(self, bid: int, it: int) -> None:
        self.done = bid
        if self.host is not None:
            hpages = self.host.on_processed(bid)
            if hpages:
                self.dev.transfer_host_slots(self._slots(hpages), None)
        pages = self.kv.on_processed(bid)
        if pages:
            slots = self._slots(pages)
            self.dev.transfer_slots(slots, None)
            self.emit(E.PendingReleased(it, bid, slots))

    # -- integrity ------------------------------------------------------------------------
    def check_integrity(self, live: Dict[int, Request]) -> None:
        """Pool and rows consistent with the live requests' page lists and rows."""
        self.kv.check_integrity()
        self.rows.check_integrity()
        if self.tree is not None:
            self.tree.check_integrity()
            if self.tree.pages != len(self.kv.cached):
                raise AssertionError(f"radix tree holds {self.tree.pages} pages, the pool "
                                     f"counts {len(self.kv.cached)} cached")
        if self.host is not None:
            self.host.check_integrity()
        pages = {}
        for r in live.values():
            for p in r.pages[:r.shared]:
                if p not in self.kv.cached:
                    raise AssertionError(f"request {r.rid} shares page {p}, not cached")
            for p in r.pages[r.shared:]:
                own = self.kv.owned.get(p)
                if own is None or own.rid != r.rid:
                    raise AssertionError(f"request {r.rid} lists page {p}, ledger says {own}")
                pages[p] = r.rid
            if r.row is not None and self.rows.owner.get(r.row) != r.rid:
                raise AssertionError(f"request {r.rid} holds row {r.row}, "
                                     f"row pool says {self.rows.owner.get(r.row)}")
            if len(r.pages) * self.ps > self.cfg.row_width:
                raise AssertionError(f"request {r.rid} holds {len(r.pages)} pages, "
                                     f"beyond the row width {self.cfg.row_width}")
        stray = set(self.kv.owned) - set(pages)
        if stray:
            p = min(stray)
            raise AssertionError(f"{len(stray)} owned pages belong to no live request, e.g. "
                                 f"page {p}: {self.kv.owned[p]}")

    def is_full(self) -> bool:
        host_full = self.host is None or self.host.free_pages == self.host.total
        cached = len(self.kv.cached)
        unlocked = self.tree is None or not any(self.tree.page_locks().values())
        return (self.kv.free_pages + cached == self.kv.total and unlocked
                and len(self.rows.free) == self.rows.total and host_full)
