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
With prefix caching off (the target's setting) no block has two owners.
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

    # -- events -----------------------------------------------------------------------------
    def memory(self, it: int, batch: int, reasons: Dict[int, str]) -> None:
        """Emit the block moves since the last call; ``reasons``: rid -> finish, abort or
        retract, for requests that left this call (others default to finish)."""
        now, parked = self.held(), self.parked()
        emit, allocs = self.emit, []
        for rid in sorted(set(self.blocks) | set(now)):
            before, after = self.blocks.get(rid, ()), now.get(rid, ())
            if before == after:
                continue
            keep, had = set(after), set(before)
            gone = [b for b in before if b not in keep]
            new = [b for b in after if b not in had]
            if gone:
                pend = tuple(b for b in gone if b in parked)
                done = tuple(b for b in gone if b not in parked)
                why = reasons.get(rid, "finish")
                if done:
                    emit(E.Freed(it, batch, rid, done, why, False, None))
                if pend:
                    until = max(parked[b] for b in pend) - 1
                    emit(E.Freed(it, batch, rid, pend, why, True, until))
                    for b in pend:
                        self.deferred[b] = (rid, until)
                for b in gone:
                    self.owner.pop(b, None)
            if new:
                allocs.append((rid, tuple(new)))
        for rid, new in allocs:       # after every free: a block may change owner in one call
            emit(E.Allocated(it, batch, rid, "kv", new, self.rows.get(rid, -1)))
            for b in new:
                self.owner[b] = (rid, it)
        self.blocks = now
        back = tuple(sorted(b for b in self.deferred if b not in parked))
        if back:
            emit(E.PendingReleased(it, batch, back))
            for b in back:
                del self.deferred[b]

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
        return E.Snapshot(
            total=total, free=self.pool.get_num_free_blocks(), owned=len(self.owner),
            pending=len(pend), ledger=ledger, pending_slots=pend, requests=tuple(reqs),
            inflight=inflight, rows_free=len(self.free_rows), idle=idle, syncs=0,
            declared_syncs=0, page_size=1, row_width=0, rows_total=len(self.free_rows) + len(self.rows))


def _state(r) -> str:
    name = r.status.name
    if name == "RUNNING":
        return "prefilling" if r.num_output_tokens == 0 else "running"
    if name.startswith("FINISHED"):
        return "aborted" if name == "FINISHED_ABORTED" else "finished"
    return "waiting"
