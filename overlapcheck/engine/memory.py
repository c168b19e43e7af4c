"""KV memory: a paged token->KV allocator with an ownership ledger, and the
request-pool row allocator. Plain Python; no device values.

Pending-free rule: a torn-down request's pages that an unprocessed batch may still
touch become *pending-free*, keyed by the newest such batch; they return to the free
list when that batch's result is processed (``on_processed``). Pages of a request that
rides no unprocessed batch are freed at once. Request-pool rows are freed at once:
their reuse is ordered by the WAR barrier on the schedule stream.

With the radix prefix cache (docs/design.md §4.13) a page may also be *cached*: held by
the tree (``engine/radix.py``), owned by no request, read by every request whose
matched prefix covers it; it leaves the tree by eviction, pending-free like any other
page while a batch that may read it is unprocessed.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

from ..protocol.events import LazyTuple
from ..protocol.types import BatchId, RequestId, Step
from .config import EngineConfig

PREFILL_PURPOSE, DECODE_PURPOSE, DRAFT_PURPOSE = "prefill", "decode", "draft"
VERIFY_PURPOSE = "verify"   # frozen-KV MTP's decode reserve: target KV only (Scheduler.decode_purpose)
BACKUP_PURPOSE = "backup"   # host-pool pages holding a request's KV backup (kv_backup)


@dataclass(frozen=True)
class Owner:
    """Ledger entry of a page (and of each of its slots)."""

    rid: RequestId
    purpose: str
    step: Step


class KVPool:
    """Pages ``1..cfg.pages`` (page 0 is the padding page, never handed out)."""

    def __init__(self, cfg: EngineConfig):
        self.page_size = cfg.page_size
        self.total = cfg.pages
        self.free: List[int] = list(range(self.total, 0, -1))  # a stack: lowest page first
        self.owned: Dict[int, Owner] = {}
        self.owned_by: Dict[RequestId, int] = {}   # pages in ``owned`` per request
        self.pending: Dict[BatchId, Dict[int, Owner]] = {}
        self.cached: Dict[int, Owner] = {}   # prefix cache: pages the tree holds (§4.13)
        self._views: list = []    # weak references to views of the pool as it is now

    # -- views ---------------------------------------------------------------------------
    def view(self, make: Callable[[], tuple], size: Optional[int] = None):
        """``make()`` (a function of the pool's state) as a tuple computed when first
        read; one still unread when the pool next changes is computed just before
        (copy on write), so a view reads as the pool was when it was made. ``size``:
        its length, where known now (``LazyTuple``)."""
        v = LazyTuple(make, size)
        self._views.append(weakref.ref(v))
        return v

    def _changing(self) -> None:
        for ref in self._views:
            v = ref()
            if v is not None:
                v.get()
        self._views.clear()

    def ledger_rows(self) -> tuple:
        """(slot, rid, purpose, allocating step) of owned and pending slots, by slot."""
        return tuple((s, o.rid, o.purpose, o.step) for s, o in sorted(self.ledger().items()))

    def ledger_size(self) -> int:
        """``len(ledger_rows())`` without building it: the slots of the distinct owned
        and pending pages (a page's slots are its own)."""
        pages = set(self.owned)
        for table in self.pending.values():
            pages.update(table)
        return len(pages) * self.page_size

    def pending_slots(self) -> tuple:
        """The pending-free slots, sorted."""
        return tuple(sorted(s for b in self.pending.values() for p in b for s in self.slots(p)))

    # -- queries -----------------------------------------------------------------------
    @property
    def free_pages(self) -> int:
        return len(self.free)

    @property
    def pending_pages(self) -> int:
        return sum(len(p) for p in self.pending.values())

    def slots(self, page: int) -> range:
        return range(page * self.page_size, (page + 1) * self.page_size)

    def pages_for(self, tokens: int) -> int:
        return -(-tokens // self.page_size)

    # -- check-then-act ------------------------------------------------------------------
    def can_allocate(self, n: int) -> bool:
        return 0 <= n <= len(self.free)

    def allocate(self, n: int, rid: RequestId, purpose: str, step: Step) -> List[int]:
        if self._views:
            self._changing()
        if not self.can_allocate(n):
            raise MemoryError(f"allocate {n} pages for request {rid}: only {len(self.free)} free")
        pages = [self.free.pop() for _ in range(n)]
        own = Owner(rid, purpose, step)     # immutable: one entry for every page
        for p in pages:
            self.owned[p] = own
        self.owned_by[rid] = self.owned_by.get(rid, 0) + n
        return pages

    def release(self, pages: List[int], rid: RequestId, after: Optional[BatchId]) -> List[int]:
        """Take ``rid``'s pages away from it: pending-free until batch ``after`` is
        processed, or free now (``after`` None). Returns the pages freed now."""
        if self._views:
            self._changing()
        for p in pages:
            own = self.owned.get(p)
            if own is None or own.rid != rid:
                raise ValueError(f"release of page {p} by request {rid}: owned by {own}")
        self._disown(rid, len(pages))
        if after is not None:
            bucket = self.pending.setdefault(after, {})
            for p in pages:
                bucket[p] = self.owned.pop(p)
            return []
        for p in pages:
            del self.owned[p]
        self.free.extend(reversed(pages))
        return list(pages)

    def cache(self, pages: List[int], rid: RequestId) -> None:
        """``rid``'s pages go to the prefix cache (the tree owns them now)."""
        if self._views:
            self._changing()
        for p in pages:
            own = self.owned.get(p)
            if own is None or own.rid != rid:
                raise ValueError(f"caching of page {p} by request {rid}: owned by {own}")
            self.cached[p] = self.owned.pop(p)
        self._disown(rid, len(pages))

    def _disown(self, rid: RequestId, n: int) -> None:
        if not n:
            return
        left = self.owned_by[rid] - n
        if left:
            self.owned_by[rid] = left
        else:
            self.owned_by.pop(rid, None)

    def owned_rows(self) -> tuple:
        """(request, slots) of the owned slots per request, by request (the snapshot's
        ``owned_by``)."""
        return tuple(sorted((rid, n * self.page_size) for rid, n in self.owned_by.items()))

    def uncache(self, pages: List[int], after: Optional[BatchId]) -> List[int]:
        """Evicted pages leave the prefix cache: pending-free until batch ``after`` is
        processed, or free now. Returns the pages freed now."""
        if self._views:
            self._changing()
        for p in pages:
            if p not in self.cached:
                raise ValueError(f"eviction of page {p}, which the prefix cache does not hold")
        if after is not None:
            bucket = self.pending.setdefault(after, {})
            for p in pages:
                bucket[p] = self.cached.pop(p)
            return []
        for p in pages:
            del self.cached[p]
        self.free.extend(reversed(pages))
        return list(pages)

    def cache_rows(self, locks: Dict[int, int]) -> tuple:
        """(slot, writer request, lock count) of the cached slots, by slot."""
        return tuple((s, self.cached[p].rid, locks.get(p, 0))
                     for p in sorted(self.cached) for s in self.slots(p))

    def on_processed(self, bid: BatchId) -> List[int]:
        """Batch ``bid``'s result is processed: its pending-free pages become free."""
        if self._views:
            self._changing()
        out: List[int] = []
        for key in sorted(k for k in self.pending if k <= bid):
            out.extend(self.pending.pop(key))
        self.free.extend(reversed(out))
        return out

    # -- integrity ---------------------------------------------------------------------
    def conflicts(self) -> tuple:
        """(page, the places that list it) for every page not in exactly one place
        (free, owned, cached, pending): listed twice, in two places, in none, or outside
        ``1..total``; by page. Empty for a consistent pool (the snapshot's
        ``page_conflicts``, judged by the pool-integrity checker)."""
        places: Dict[int, List[str]] = {}
        for p in self.free:
            places.setdefault(p, []).append("free")
        for where, table in [("owned", self.owned), ("cached", self.cached)] + [
                (f"pending(batch {b})", t) for b, t in self.pending.items()]:
            for p in table:
                places.setdefault(p, []).append(where)
        out = [(p, tuple(w)) for p, w in places.items()
               if len(w) != 1 or not 1 <= p <= self.total]
        out += [(p, ()) for p in range(1, self.total + 1) if p not in places]
        return tuple(sorted(out))

    def ledger(self) -> Dict[int, Owner]:
        """slot -> owner, for owned and pending-free slots."""
        out: Dict[int, Owner] = {}
        for table in [self.owned] + list(self.pending.values()):
            for p, own in table.items():
                for s in self.slots(p):
                    out[s] = own
        return out

    def check_integrity(self) -> None:
        """free + owned + pending (+ cached) == total, each page in exactly one place, no
        padding page."""
        seen: Dict[int, str] = {}
        places = [("free", self.free), ("owned", self.owned), ("cached", self.cached)]
        places += [(f"pending(batch {b})", pages) for b, pages in self.pending.items()]
        for where, pages in places:
            for p in pages:
                if not 1 <= p <= self.total:
                    raise AssertionError(f"page {p} in {where} is outside 1..{self.total}")
                if p in seen:
                    raise AssertionError(f"page {p} is both {seen[p]} and {where}")
                seen[p] = where
        if len(seen) != self.total:
            raise AssertionError(f"pool accounts for {len(seen)} of {self.total} pages: "
                                 f"free {len(self.free)}, owned {len(self.owned)}, "
                                 f"pending {self.pending_pages}, cached {len(self.cached)}")


class RowPool:
    """Request-pool rows (request->token table rows, FutureMap rows)."""

    def __init__(self, rows: int):
        self.total = rows
        self.free: List[int] = list(range(rows - 1, -1, -1))
        self.owner: Dict[int, RequestId] = {}

    def can_allocate(self) -> bool:
        return bool(self.free)

    def allocate(self, rid: RequestId) -> int:
        if not self.free:
            raise MemoryError(f"no free request-pool row for request {rid}")
        row = self.free.pop()
        self.owner[row] = rid
        return row

    def release(self, row: int, rid: RequestId) -> None:
        if self.owner.get(row) != rid:
            raise ValueError(f"release of row {row} by request {rid}: owned by {self.owner.get(row)}")
        del self.owner[row]
        self.free.append(row)

    def check_integrity(self) -> None:
        if set(self.free) & set(self.owner) or len(set(self.free)) != len(self.free):
            raise AssertionError(f"row pool: free {sorted(self.free)} vs owned {sorted(self.owner)}")
        if len(self.free) + len(self.owner) != self.total:
            raise AssertionError(f"row pool accounts for {len(self.free) + len(self.owner)} "
                                 f"of {self.total} rows")
