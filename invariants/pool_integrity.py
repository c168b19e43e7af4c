"""pool-integrity: the memory structures hold together at every step, as the engine's own
``check_integrity`` (its ``strict`` mode, a test shortcut) asserts at idle, judged from
the snapshot in every run.

- **Request-pool rows**: free + held == total, each row once (no phantom or duplicate
  free row, no row both free and held, none outside ``0..total-1``); the rows the pool
  holds are those the events assigned and did not release, each held by the live
  request that says it holds it.
- **The radix prefix cache** (docs/design.md §4.13): each node's pages are exactly the
  pages its key covers (one per ``page_size`` positions), no page in two nodes; a node's
  lock count is not negative nor below its children's; the tree's page count is its
  nodes' pages, and those are exactly the pages the pool counts as cached; the locks on
  the tree's top nodes are the live requests that read a matched prefix.
- **The KV ledger**: a live request owns (outside the pending-free ledger) exactly the
  slots it lists beyond its shared prefix; with the KV backup, so does its host-pool
  backup.
- **The KV pool and the host pool**, at idle (where ``strict`` checked them): every page
  in exactly one place (free, owned, cached or pending), none outside the pool.

Each violation names the step and both facts: what the structure should hold and what
the snapshot shows. The counts' formulas, leaks and lock leaks are kv-accounting's.
"""
from __future__ import annotations

from collections import Counter
from typing import Dict, List, Set

from overlapcheck.protocol import events as E

from .base import Checker, Violation
from .text import span

_ENDED = ("finished", "aborted")


class PoolIntegrity(Checker):
    name = "pool-integrity"
    targets = ("reference",)

    def __init__(self, **context) -> None:
        super().__init__()
        self.rows: Dict[int, int] = {}          # row -> request, from the events
        self._reported: Set[tuple] = set()      # sites already reported (once per run)

    def _v(self, step: int, msg: str, expected: str, seen: str, site: tuple,
           **details) -> List[Violation]:
        if site in self._reported:
            return []
        self._reported.add(site)
        return [Violation(self.name, step, msg, expected, seen, site, details)]

    def on_RowAssigned(self, ev: E.RowAssigned) -> None:
        self.rows[ev.row] = ev.rid

    def on_RowReleased(self, ev: E.RowReleased) -> None:
        if self.rows.get(ev.row) == ev.rid:
            del self.rows[ev.row]

    # -- every step ------------------------------------------------------------------------
    def on_StepEnd(self, ev: E.StepEnd) -> List[Violation]:
        snap, it = ev.snapshot, ev.iteration
        live = snap.requests if snap.live is None else snap.live
        out = self._rows(snap, live, it)
        if snap.cache_nodes or snap.cache_pages or snap.cached:
            out += self._tree(snap, live, it)
        out += self._ledger(snap, live, it)
        if snap.idle and snap.page_conflicts:
            out += self._pages(snap, it)
        return out

    def _rows(self, snap, live, it: int) -> List[Violation]:
        total, free, held = snap.rows_total, snap.rows_free_list, snap.rows_held
        if not total:
            return []
        held_map = dict(held)
        twice = sorted(r for r, n in Counter(free).items() if n > 1)
        outside = sorted({r for r in free if not 0 <= r < total} |
                         {r for r in held_map if not 0 <= r < total})
        both = sorted(set(free) & set(held_map))
        out: List[Violation] = []
        if len(free) + len(held) != total or twice or outside or both:
            what = []
            if twice:
                what.append(f"row(s) {span(twice)} listed free more than once")
            if outside:
                what.append(f"row(s) {span(outside)} outside 0..{total - 1}")
            if both:
                what.append(f"row(s) {span(both)} both free and held")
            out += self._v(it, f"request-pool rows: free {len(free)} + held {len(held)} = "
                           f"{len(free) + len(held)} of {total} rows"
                           + (f" ({'; '.join(what)})" if what else ""),
                           f"free + held == {total} rows, each row in one place",
                           f"free list {list(free)}, held rows {sorted(held_map)}",
                           ("rows", "phantom" if len(free) + len(held) > total else
                            "lost" if len(free) + len(held) < total else "misplaced"),
                           free=list(free), held=sorted(held_map), total=total)
        if held_map != self.rows:
            diff = sorted(set(held_map.items()) ^ set(self.rows.items()))
            row = diff[0][0]
            out += self._v(it, f"request-pool row {row}: the pool and the events disagree",
                           f"row {row} held by request {self.rows.get(row)} (events: "
                           f"assigned, not released)",
                           f"the pool says row {row} is held by request {held_map.get(row)}",
                           ("rows-events",), row=row)
        by_rid = {r.rid: r for r in live}
        for row, rid in held:
            st = by_rid.get(rid)
            if st is None or st.row != row or st.state in _ENDED:
                seen = ("it is not live" if st is None else
                        f"it is {st.state}" if st.state in _ENDED else f"it holds row {st.row}")
                out += self._v(it, f"request-pool row {row} held for request {rid}, which "
                               f"does not hold it", f"request {rid} holds row {row}", seen,
                               ("row-owner",), row=row, rid=rid)
        for st in live:
            if st.row is not None and held_map.get(st.row) != st.rid:
                out += self._v(it, f"request {st.rid} holds row {st.row}, which the pool "
                               f"does not give it", f"the pool holds row {st.row} for "
                               f"request {st.rid}",
                               f"row {st.row} held for {held_map.get(st.row)}",
                               ("row-owner",), row=st.row, rid=st.rid)
        return out

    def _tree(self, snap, live, it: int) -> List[Violation]:
        ps, out = snap.page_size, []
        where: Dict[int, int] = {}
        top_locks, serials, counted = 0, {n[0] for n in snap.cache_nodes}, 0
        for serial, parent, positions, pages, lock, below in snap.cache_nodes:
            counted += len(pages)
            if not positions or positions % ps or len(pages) != positions // ps:
                out += self._v(it, f"radix node {serial} holds {len(pages)} pages, its key "
                               f"covers {positions} positions", f"{positions // ps} page(s): "
                               f"one per {ps} positions of its key, a whole number of pages",
                               f"{len(pages)} page(s) {span(pages)} for {positions} positions",
                               ("radix-pages",), node=serial, pages=list(pages),
                               positions=positions)
            if lock < 0 or lock < below:
                out += self._v(it, f"radix node {serial} lock count {lock}",
                               f"a lock count >= 0 and >= its children's ({below})",
                               f"lock {lock}", ("radix-lock",), node=serial)
            for p in pages:
                if p in where:
                    out += self._v(it, f"page {p} held by radix nodes {where[p]} and {serial}",
                                   "each cached page in one node",
                                   f"page {p} in node {where[p]} and node {serial}",
                                   ("radix-shared-page",), page=p)
                where[p] = serial
            if parent not in serials:
                top_locks += lock
        if counted != snap.cache_pages:
            out += self._v(it, f"radix tree counts {snap.cache_pages} pages, its nodes hold "
                           f"{counted}", f"{counted} pages (its nodes')",
                           f"{snap.cache_pages} counted", ("radix-count",))
        pool = {s // ps for s, _, _ in snap.cache_ledger}
        if pool != set(where):
            extra, missing = sorted(pool - set(where)), sorted(set(where) - pool)
            out += self._v(it, f"the pool's cached pages differ from the radix tree's",
                           f"the pool caches exactly the {len(where)} pages the tree's nodes "
                           f"hold", (f"cached in the pool, in no node: pages {span(extra)}"
                                     if extra else "") +
                           ("; " if extra and missing else "") +
                           (f"in a node, not cached in the pool: pages {span(missing)}"
                            if missing else ""), ("radix-pool",), extra=extra,
                           missing=missing)
        readers = sorted(st.rid for st in live if st.shared and st.state not in _ENDED)
        if top_locks != len(readers):
            out += self._v(it, f"radix locks {top_locks} on the tree's top nodes, "
                           f"{len(readers)} live requests reading a cached prefix",
                           f"one lock per live request with a shared prefix "
                           f"({len(readers)}: requests {readers[:8]})",
                           f"{top_locks} lock(s) on the top nodes", ("radix-readers",))
        return out

    def _ledger(self, snap, live, it: int) -> List[Violation]:
        """A live request owns exactly the slots it lists beyond its shared prefix, in
        the KV pool and (KV backup) in the host pool."""
        owned = dict(snap.owned_by)
        out: List[Violation] = []
        if sum(owned.values()) != snap.owned:
            out += self._v(it, "the ledger's owned slots per request do not add up",
                           f"{snap.owned} owned slots (the pool's count)",
                           f"{sum(owned.values())} over requests {sorted(owned)[:8]}",
                           ("ledger-count",))
        host = dict(snap.host_owned_by) if snap.host_total else None
        for st in live:
            if st.state in _ENDED:
                continue        # what an ended request still owns is kv-accounting's leak
            own = st.allocated - st.shared
            if owned.get(st.rid, 0) != own:
                out += self._v(it, f"request {st.rid} lists {own} slots of its own, the ledger "
                               f"gives it {owned.get(st.rid, 0)}",
                               f"the ledger's owned slots of request {st.rid}: {own} "
                               f"(allocated {st.allocated} - shared {st.shared})",
                               f"{owned.get(st.rid, 0)} owned slots in the ledger",
                               ("ledger",), rid=st.rid)
            if host is not None and host.get(st.rid, 0) != own:
                out += self._v(it, f"request {st.rid}'s host-pool backup holds "
                               f"{host.get(st.rid, 0)} slots for {own} device slots",
                               f"{own} host-pool slots (one per slot of its own)",
                               f"{host.get(st.rid, 0)} host-pool slots in its ledger",
                               ("host-ledger",), rid=st.rid)
        return out

    def _pages(self, snap, it: int) -> List[Violation]:
        out = []
        for pool, page, places in snap.page_conflicts:
            what = ("in no place" if not places else " and ".join(places)
                    if len(places) > 1 else f"{places[0]}, outside the pool")
            out += self._v(it, f"{pool} pool page {page} is {what} at idle",
                           f"{pool} pool page {page} in exactly one place (free, owned, "
                           f"cached, pending)", f"page {page}: {what}",
                           ("pages", pool), page=page, places=list(places))
        return out
