"""Turning the vLLM scheduler's own state into overlapcheck's shared events.

After each scheduler call the ``Tracker`` diffs what vLLM's KV manager says each
request holds (``req_to_blocks`` of the one full-attention group, the null block
excluded) against the previous call, and the blocks parked in ``deferred_frees``:

* blocks that appear for a request: ``Allocated`` (block ids as slots, purpose "kv");
* blocks that leave a request: ``Freed``, pending until the fence's batch when vLLM
  parked them in ``deferred_frees``, else free now; parked blocks that return to the
  pool: ``PendingReleased``;
* "rows" are the running slots (at most ``max_num_seqs``): a request takes one when it
  enters ``running`` and gives it back when it leaves (finish, abort, preemption).

Batch ids count the non-empty scheduler outputs from 0, so vLLM's fence sequence
number ``s`` (``sched_step_seq`` at a request's last scheduling) is batch ``s - 1``.

With prefix caching (``prefix_caching``) a block may have several holders, and the
ledger is the prefix cache's (docs/design.md §4.13): a block in vLLM's
``BlockPool.cached_block_hash_to_block`` is *cached*, owned by no request.

* A block its owner filled gets a hash (``cache_full_blocks``, at the schedule of the
  chunk that fills it): ``Cached`` by that owner.
* Each request holds one lock on the cached blocks in its table (a prefix hit, and
  its own blocks once cached): ``PrefixLocked`` with the whole set, re-taken
  (``PrefixReleased`` then ``PrefixLocked``) when the set changes, released when
  the request leaves (with the fence as ``until`` when vLLM parks its references).
  A new block that was cached before the call is a hit: no ``Allocated``.
* A cached block whose hash went (``_maybe_evict_cached_block`` when
  ``get_new_blocks`` takes it from the free queue): ``Evicted``, free now; taken by a
  request, it is then ``Allocated`` to it.
* Snapshot: ``cached`` counts the map's blocks; ``free`` is vLLM's free queue less
  its cached (``ref_cnt`` 0, evictable) blocks; each cached block's lock count is
  vLLM's ``ref_cnt`` less the references parked in ``deferred_frees``.

Without prefix caching no block has two owners and none of the cache's events occur.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Set, Tuple

from ...protocol import events as E


class Tracker:
    def __init__(self, sched, emit: Callable, max_rows: int, block_size: int):
        self.sched, self.emit, self.block_size = sched, emit, block_size
        self.manager = sched.kv_cache_manager.coordinator.single_type_managers[0]
        self.pool = sched.kv_cache_manager.block_pool
        self.blocks: Dict[int, Tuple[int, ...]] = {}        # rid -> blocks held
        self.owner: Dict[int, Tuple[int, int]] = {}          # block -> (rid, step allocated)
        self.deferred: Dict[int, Tuple[int, int]] = {}      # block -> (rid, until batch)
        self.rows: Dict[int, int] = {}                       # rid -> running slot
        self.free_rows: List[int] = list(range(max_rows - 1, -1, -1))
        # prefix caching: cached block -> (its hash, the request that wrote it); the
        # cached blocks each request holds (its lock)
        self.cached: Dict[int, Tuple[bytes, int]] = {}
        self.locks: Dict[int, Tuple[int, ...]] = {}
        self._hit: Dict[int, Set[int]] = {}                  # rid -> blocks hit this call
        if self.pool.enable_caching:
            self._watch_hits()

    def _watch_hits(self) -> None:
        """Note which blocks vLLM hands a request as a prefix hit: its manager's
        ``add_local_computed_blocks`` (the blocks it touches), shadowed on this one
        manager instance, behaviour unchanged. A block two requests take in one
        scheduler call — one allocates and fills it, the other hits it — is told apart
        by this alone."""
        manager, hit = self.manager, self._hit
        original = manager.add_local_computed_blocks

        def add_local_computed_blocks(request_id, new_computed_blocks, *args, **kw):
            hit.setdefault(int(request_id), set()).update(
                b.block_id for b in new_computed_blocks if not b.is_null)
            return original(request_id, new_computed_blocks, *args, **kw)
        manager.add_local_computed_blocks = add_local_computed_blocks

    # -- reading vLLM ---------------------------------------------------------------------
    def held(self) -> Dict[int, Tuple[int, ...]]:
        out = {}
        for rid_s, blocks in self.manager.req_to_blocks.items():
            ids = tuple(b.block_id for b in blocks if not b.is_null)
            if ids:
                out[int(rid_s)] = ids
        return out

    def parked(self) -> Dict[int, int]:
        """block -> fence sequence number, for blocks in ``deferred_frees``."""
        return {b.block_id: fence for fence, blocks in self.sched.deferred_frees
                for b in blocks if not b.is_null}

    def parked_refs(self) -> Dict[int, int]:
        """block -> references parked in ``deferred_frees`` (not yet given back)."""
        out: Dict[int, int] = {}
        for _, blocks in self.sched.deferred_frees:
            for b in blocks:
                if not b.is_null:
                    out[b.block_id] = out.get(b.block_id, 0) + 1
        return out

    def in_cache(self) -> Dict[int, bytes]:
        """block -> its hash, for the blocks of vLLM's prefix cache map (empty without
        prefix caching)."""
        out = {}
        for v in self.pool.cached_block_hash_to_block._cache.values():
            for b in (v.values() if isinstance(v, dict) else (v,)):
                if not b.is_null:
                    out[b.block_id] = b.block_hash
        return out

    # -- events -----------------------------------------------------------------------------
    def memory(self, it: int, batch: int, reasons: Dict[int, str]) -> None:
        """Emit the block moves since the last call; ``reasons``: rid -> finish, abort or
        retract, for requests that left this call (others default to finish)."""
        now, parked = self.held(), self.parked()
        pref = self.in_cache() if self.pool.enable_caching else {}
        emit = self.emit
        news: Dict[int, List[int]] = {}
        gones: Dict[int, List[int]] = {}
        for rid in sorted(set(self.blocks) | set(now)):
            before, after = self.blocks.get(rid, ()), now.get(rid, ())
            if before != after:
                keep, had = set(after), set(before)
                gones[rid] = [b for b in before if b not in keep]
                news[rid] = [b for b in after if b not in had]
        hit, self._hit = dict(self._hit), self._hit
        self._hit.clear()
        if pref:
            # owned blocks that got a hash: cached by their owner (unless the owner let
            # the block go and another request took it fresh and filled it)
            fresh = {b for rid, bl in news.items() for b in bl if b not in hit.get(rid, ())}
            by: Dict[int, List[int]] = {}
            for b, (rid, _) in self.owner.items():
                if b in pref and (b not in fresh or b in now.get(rid, ())):
                    by.setdefault(rid, []).append(b)
            self._cache(it, batch, by, pref)
        for rid, gone in gones.items():
            lock = self.locks.get(rid, ())
            if lock and not set(lock) <= set(now.get(rid, ())):
                pend = [parked[b] for b in lock if b in parked]
                emit(E.PrefixReleased(it, batch, rid, lock, max(pend) - 1 if pend else None))
                del self.locks[rid]
            owned = [b for b in gone if b in self.owner]
            if owned:
                pend = tuple(b for b in owned if b in parked)
                done = tuple(b for b in owned if b not in parked)
                why = reasons.get(rid, "finish")
                if done:
                    emit(E.Freed(it, batch, rid, done, why, False, None))
                if pend:
                    until = max(parked[b] for b in pend) - 1
                    emit(E.Freed(it, batch, rid, pend, why, True, until))
                    for b in pend:
                        self.deferred[b] = (rid, until)
                for b in owned:
                    del self.owner[b]
        if self.cached:
            evicted = tuple(sorted(b for b, (h, _) in self.cached.items() if pref.get(b) != h))
            if evicted:
                emit(E.Evicted(it, batch, evicted, False, None))
                for b in evicted:
                    del self.cached[b]
        for rid, new in news.items():   # after every free: a block may change owner in one call
            got = hit.get(rid, ())
            fresh = tuple(b for b in new if b not in got)
            if fresh:
                emit(E.Allocated(it, batch, rid, "kv", fresh, self.rows.get(rid, -1)))
                for b in fresh:
                    self.owner[b] = (rid, it)
        if pref and len(self.cached) != len(pref):
            # allocated and filled in this call; a hash on a block no request owned is
            # vLLM's, reported as cached by no request (-1)
            by = {}
            for b in pref:
                if b not in self.cached:
                    by.setdefault(self.owner[b][0] if b in self.owner else -1, []).append(b)
            self._cache(it, batch, by, pref)
        if self.cached or self.locks:
            for rid in sorted(set(now) | set(self.locks)):
                want = tuple(b for b in now.get(rid, ()) if b in self.cached)
                have = self.locks.get(rid, ())
                if want != have:
                    if have:
                        emit(E.PrefixReleased(it, batch, rid, have, None))
                    if want:
                        emit(E.PrefixLocked(it, batch, rid, want))
                        self.locks[rid] = want
                    else:
                        del self.locks[rid]
        self.blocks = now
        back = tuple(sorted(b for b in self.deferred if b not in parked))
        if back:
            emit(E.PendingReleased(it, batch, back))
            for b in back:
                del self.deferred[b]

    def _cache(self, it: int, batch: int, by: Dict[int, List[int]], pref) -> None:
        for rid in sorted(by):
            slots = tuple(sorted(by[rid]))
            self.emit(E.Cached(it, batch, rid, slots))
            for b in slots:
                self.owner.pop(b, None)
                self.cached[b] = (pref[b], rid)

    def rows_update(self, it: int, batch: int, running: Set[int]) -> None:
        for rid in sorted(set(self.rows) - running):
            self.emit(E.RowReleased(it, batch, rid, self.rows[rid]))
            self.free_rows.append(self.rows.pop(rid))
        for rid in sorted(running - set(self.rows)):
            row = self.free_rows.pop() if self.free_rows else -1
            self.rows[rid] = row
            self.emit(E.RowAssigned(it, batch, rid, row))

    def snapshot(self, live, inflight: Tuple[int, ...], rid_batches: Dict[int, List[int]],
                 idle: bool) -> E.Snapshot:
        """``live``: the scheduler's live requests (rid, Request), in rid order."""
        total = self.pool.num_gpu_blocks - 1
        ledger = tuple(sorted((b, rid, "kv", step) for b, (rid, step) in self.owner.items()))
        pend = tuple(sorted(self.deferred))
        reqs = []
        for rid, r in live:
            reqs.append(E.ReqState(
                rid, _state(r), self.rows.get(rid), r.num_computed_tokens,
                len(self.blocks.get(rid, ())) * self.block_size, r.num_output_tokens,
                tuple(rid_batches.get(rid, ()))))
        free, cached, cache_ledger = self.pool.get_num_free_blocks(), 0, ()
        if self.pool.enable_caching:
            pref, refs, blocks = self.in_cache(), self.parked_refs(), self.pool.blocks
            cached = len(pref)
            # a cached block in the free queue (no reference left) is evictable, not free
            free -= sum(1 for b in pref if blocks[b].ref_cnt == 0)
            cache_ledger = tuple(
                (b, self.cached.get(b, (b"", -1))[1], blocks[b].ref_cnt - refs.get(b, 0))
                for b in sorted(pref))
        return E.Snapshot(
            total=total, free=free, owned=len(self.owner),
            pending=len(pend), ledger=ledger, pending_slots=pend, requests=tuple(reqs),
            inflight=inflight, rows_free=len(self.free_rows), idle=idle, syncs=0,
            declared_syncs=0, page_size=1, row_width=0, rows_total=len(self.free_rows) + len(self.rows),
            cached=cached, cache_ledger=cache_ledger)


def _state(r) -> str:
    name = r.status.name
    if name == "RUNNING":
        return "prefilling" if r.num_output_tokens == 0 else "running"
    if name.startswith("FINISHED"):
        return "aborted" if name == "FINISHED_ABORTED" else "finished"
    return "waiting"
