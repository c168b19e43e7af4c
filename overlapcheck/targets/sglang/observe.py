"""What SGLang's own state shows after a host iteration, as overlapcheck events.

``Observer.step(...)`` reads the scheduler's state — the KV allocator's free pages, its
request->token table (``req_to_token_pool``) and each live request's ``req.kv``
(``req_pool_idx``, ``kv_allocated_len``, ``kv_committed_len``) — and diffs it against
the previous step:

* a request's *owned* slots are ``req_to_token[row, 0:kv_allocated_len]``, widened to
  whole pages; slots entering that set are ``Allocated`` (purpose ``prefill`` below the
  prompt, ``decode`` up to the committed length, ``draft`` beyond it); slots that left
  it and are back on the free list are ``Freed``; a slot that left it but is neither
  free nor owned by anyone stays attributed to the request — SGLang frees at once
  (``free_group`` batches close within the step), so such a slot is a leak, and
  kv-accounting reports it when the request ends;
* ``free`` is the allocator's free count as it reports it (free pages plus release
  pages, in slots): a slot freed twice or freed while still owned makes
  free + owned exceed the total, which kv-accounting's pool formula shows (the formula
  SGLang itself asserts at idle: available + evictable + protected == total; the radix
  cache is off, so evictable and protected are 0); SGLang has no pending-free slots;
* ``RowAssigned``/``RowReleased`` follow ``req.kv.req_pool_idx``, in the order SGLang
  must have made them: within a step every release comes before every assignment (a
  row is free before it is handed out again; a request that took the row of one that
  ended in the same step did so after it was freed), whatever the requests' order;
* request states: waiting (in the waiting queue), prefilling (holding a row, no output
  yet), running, finished, aborted; a retraction (``retraction_count`` grows) is
  ``Retracted``.
"""
from __future__ import annotations

from typing import Dict, List, Set, Tuple

from overlapcheck.protocol import events as E

PREFILL, DECODE, DRAFT = "prefill", "decode", "draft"


def visible(req) -> List[int]:
    """The tokens a request shows its client: output cut at ``finished_len``."""
    out = req.output_ids
    n = req.finished_len if req.finished_len is not None else len(out)
    return [int(t) for t in out[:n]]


class Observer:
    def __init__(self, scheduler, page_size: int, emit):
        self.s = scheduler
        self.page_size = page_size
        self.emit = emit
        self.total = _full_allocator(scheduler).size
        self.row_width = scheduler.req_to_token_pool.req_to_token.shape[1]
        self.rows_total = scheduler.req_to_token_pool.size
        self.owner: Dict[int, Tuple[int, str, int]] = {}     # slot -> (rid, purpose, step)
        self.by_rid: Dict[int, Set[int]] = {}
        self.rows: Dict[int, int] = {}                        # rid -> row
        self.retractions: Dict[int, int] = {}

    # -- reading SGLang ---------------------------------------------------------------------
    def free_slots(self) -> Tuple[int, List[int]]:
        """(count as the allocator reports it, the slots it lists)."""
        a = _full_allocator(self.s)
        if hasattr(a, "get_all_free_pages"):           # paged: free + staged pages
            pages = [int(x) for x in a.get_all_free_pages().tolist()]
        else:                                          # page size 1: free + release
            pages = [int(x) for x in a.free_pages.tolist()] + \
                    [int(x) for x in a.release_pages.tolist()]
        if self.page_size == 1:
            return len(pages), pages
        ps = self.page_size
        slots = [p * ps + j for p in pages for j in range(ps)]
        return len(slots), slots

    def owned_now(self, req) -> Set[int]:
        kv = req.kv
        if kv.req_pool_idx is None or kv.kv_allocated_len <= 0:
            return set()
        n = int(kv.kv_allocated_len)
        locs = self.s.req_to_token_pool.req_to_token[kv.req_pool_idx, :n].tolist()
        if self.page_size == 1:
            return set(int(x) for x in locs)
        ps = self.page_size
        return {p * ps + j for p in {int(x) // ps for x in locs} for j in range(ps)}

    # -- one step ---------------------------------------------------------------------------
    def memory(self, it: int, batch: int, live: Dict[int, object], prompt_len: Dict[int, int],
               reasons: Dict[int, str]) -> None:
        """Emit row and slot events for the step; ``reasons``: rid -> why it lost KV."""
        nfree, free_list = self.free_slots()
        free = set(free_list)
        now: Dict[int, Set[int]] = {rid: self.owned_now(req) for rid, req in live.items()}
        holder: Dict[int, int] = {}
        for rid, slots in now.items():
            for s in slots:
                holder.setdefault(s, rid)
        # slots leaving a request
        for rid in sorted(self.by_rid):
            gone = sorted(s for s in self.by_rid[rid] if s not in now.get(rid, ()))
            back = [s for s in gone if s in free or holder.get(s, rid) != rid]
            if back:
                self.emit(E.Freed(it, batch, rid, tuple(back), reasons.get(rid, "release"),
                                  False, None))
                for s in back:
                    # a slot SGLang handed to two requests at once (a double free let it)
                    # stays with the other one
                    if self.owner.get(s, (None,))[0] == rid:
                        del self.owner[s]
                    self.by_rid[rid].discard(s)
        self._rows(it, batch, live, reasons)
        # slots entering a request
        for rid in sorted(now):
            new = sorted(s for s in now[rid] if self.owner.get(s, (None,))[0] != rid)
            if not new:
                continue
            req = live[rid]
            row = int(req.kv.req_pool_idx)
            pos = {int(x): p for p, x in enumerate(
                self.s.req_to_token_pool.req_to_token[row, :int(req.kv.kv_allocated_len)].tolist())}
            groups: Dict[str, List[int]] = {}
            committed = int(req.kv.kv_committed_len)
            for s in new:
                p = pos.get(s, pos.get(s - s % self.page_size, 0))
                purpose = PREFILL if p < prompt_len[rid] else DECODE if p < max(committed, prompt_len[rid] + 1) else DRAFT
                groups.setdefault(purpose, []).append(s)
            for purpose, slots in sorted(groups.items()):
                self.emit(E.Allocated(it, batch, rid, purpose, tuple(slots), row))
                for s in slots:
                    self.owner[s] = (rid, purpose, it)
                    self.by_rid.setdefault(rid, set()).add(s)
        self._nfree = nfree

    def _rows(self, it: int, batch: int, live: Dict[int, object],
              reasons: Dict[int, str]) -> None:
        """The step's row releases, all of them, then its assignments. A request that
        ends this step (``reasons``: finish, abort) gives its row back if SGLang's pool
        has it free or another request holds it now; a request that ended before and
        kept a row (SGLang had not freed it yet) gives it back the same way."""
        ending = {rid for rid, why in reasons.items() if why in ("finish", "abort")}
        now: Dict[int, int] = {}
        for rid, req in live.items():
            row = req.kv.req_pool_idx
            if row is not None and rid not in ending:
                now[rid] = int(row)
        claimed = {row: rid for rid, row in now.items()}
        for rid in sorted(self.rows):
            old = self.rows[rid]
            if rid in now:
                gone = now[rid] != old
            else:        # ending now, or ended earlier: free in the pool, or taken
                gone = claimed.get(old, rid) != rid or not _row_still_held(self.s, old)
            if gone:
                self.emit(E.RowReleased(it, batch, rid, old))
                del self.rows[rid]
        for rid, row in now.items():
            if self.rows.get(rid) != row:
                self.emit(E.RowAssigned(it, batch, rid, row))
                self.rows[rid] = row

    def snapshot(self, states: Dict[int, Tuple[str, object]], inflight: Tuple[int, ...],
                 idle: bool) -> E.Snapshot:
        ledger = tuple(sorted((s, o[0], o[1], o[2]) for s, o in self.owner.items()))
        reqs = []
        for rid, (state, req) in sorted(states.items()):
            kv = req.kv if req is not None else None
            reqs.append(E.ReqState(
                rid, state, None if kv is None or kv.req_pool_idx is None else int(kv.req_pool_idx),
                int(kv.kv_committed_len) if kv is not None and kv.req_pool_idx is not None else 0,
                int(kv.kv_allocated_len) if kv is not None and kv.req_pool_idx is not None else 0,
                len(visible(req)) if req is not None else 0, ()))
        return E.Snapshot(
            total=self.total, free=self._nfree, owned=len(self.owner), pending=0, ledger=ledger,
            pending_slots=(), requests=tuple(reqs), inflight=inflight,
            rows_free=self.s.req_to_token_pool.available_size(), idle=idle, syncs=0,
            declared_syncs=0, page_size=self.page_size, row_width=self.row_width,
            rows_total=self.rows_total)


def _full_allocator(s):
    """The allocator of the slots request->token rows hold: SGLang's own, or with a
    sliding-window model (Gemma4) the full-attention half of its hybrid allocator,
    whose slots map to the window pool's (``full_to_swa_index_mapping``)."""
    a = s.token_to_kv_pool_allocator
    return getattr(a, "full_attn_allocator", a)


def _row_still_held(s, row: int) -> bool:
    return row not in s.req_to_token_pool.free_slots
