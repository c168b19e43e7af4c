"""Memory-reuse and annotation programs: request-pool rows and KV slots handed to a new
owner, torch storage returned to the caching allocator, and row annotations (which may
only narrow an access, never hide one).

PyTorch's CUDA sanitizer knows neither owners nor annotations, but the row programs are
kernels on two streams touching the same row views, so it sees their conflicts as
plain unsynchronized accesses. It cannot see the allocator reuse: a reallocated block
starts a fresh history there."""
from __future__ import annotations

import torch

from .cases import ANNOTATION, REUSE, STREAM_STREAM, pair

I64, F32 = torch.int64, torch.float32


def _fill_rows(rows, value):
    """A kernel writing ``value`` into ``rows`` of its tensor, one row view at a time."""
    rows = list(rows)

    def fill_rows(t):
        for r in rows:
            t[r].fill_(value)
    return fill_rows


@pair("req_pool_row_rewritten_without_war_barrier", "req_pool_row_rewritten_after_war_barrier",
      kinds=(REUSE,), annotated=True, sanitizer=True,
      race="a finished request's req_to_token row is handed to a new request and rewritten "
           "by the schedule stream while forward N still reads it (missing WAR barrier)",
      twin="the schedule stream waits for forward N (WAR barrier) before rewriting the row")
def _req_pool_row(rt, fixed):
    sched, fwd = rt.new_stream("schedule"), rt.new_stream("forward")
    req_to_token = rt.empty((4, 8), I64, "req_to_token", sched)
    out_cache_loc = rt.empty((8,), I64, "out_cache_loc", sched)
    forward_done = rt.new_event("forward_done")
    rt.transfer(req_to_token, [1], "req-A")
    rt.launch(sched, _fill_rows([1], 3), req_to_token.t, name="prepare_decode",
              writes=[req_to_token.rows([1])])
    fwd.wait_stream(sched)
    rt.launch(fwd, lambda o, t: o.copy_(t[1]), out_cache_loc.t, req_to_token.t,
              name="forward_batch_n", reads=[req_to_token.rows([1])], writes=[out_cache_loc])
    forward_done.record(fwd)
    # Processing batch N-1's result: req-A finished; req-B takes its row.
    rt.transfer(req_to_token, [1], None)
    rt.transfer(req_to_token, [1], "req-B")
    if fixed:
        sched.wait_event(forward_done)
    rt.launch(sched, _fill_rows([1], 7), req_to_token.t, name="prepare_prefill_next",
              writes=[req_to_token.rows([1])])


@pair("index_tensor_freed_without_record_stream", "index_tensor_freed_with_record_stream",
      kinds=(REUSE,),
      race="req_pool_indices made on the schedule stream is freed while the forward "
           "stream reads it, without record_stream; the next batch's indices reuse it",
      twin="record_stream(forward) before the free keeps the block from being reused early")
def _index_tensor(rt, fixed):
    sched, fwd = rt.new_stream("schedule"), rt.new_stream("forward")
    req_to_token = rt.empty((4, 8), I64, "req_to_token", sched)
    positions = rt.empty((2, 8), I64, "positions", fwd)
    rt.launch(sched, lambda t: t.fill_(6), req_to_token.t, name="prepare_req_to_token")
    indices = rt.empty((2,), I64, "req_pool_indices", sched)
    rt.launch(sched, lambda i: torch.arange(0, 2, out=i), indices.t, name="make_indices")
    fwd.wait_stream(sched)
    # the indices are clamped: on a GPU the race is real, and a gather that reads the
    # reused block after its next allocation's poison fill would otherwise take an
    # out-of-range index, a device-side assert that ends the whole process
    rt.launch(fwd, lambda p, t, i: p.copy_(t.index_select(0, i.clamp(0, t.shape[0] - 1))),
              positions.t, req_to_token.t, indices.t, name="forward_gather")
    if fixed:
        rt.record_stream(indices, fwd)
    rt.free(indices)
    following = rt.empty((2,), I64, "req_pool_indices", sched)
    rt.launch(sched, lambda i: torch.arange(2, 4, out=i), following.t, name="make_indices_next")


@pair("kv_slots_reused_by_schedule_stream", "kv_slots_reused_by_forward_stream",
      kinds=(REUSE,), annotated=True, sanitizer=True,
      race="a finished request's KV slots, freed while batch i reads them, are refilled for "
           "a new request by a prefix load on the schedule stream",
      twin="the same freed slots are next written on the forward stream, after batch i")
def _kv_slots(rt, fixed):
    sched, fwd = rt.new_stream("schedule"), rt.new_stream("forward")
    kv = rt.empty((16, 4), F32, "kv_cache", fwd)
    attn_out = rt.empty((4, 4), F32, "attn_out", fwd)
    slots = [4, 5, 6, 7]
    rt.transfer(kv, slots, "req-A")
    rt.launch(fwd, _fill_rows(slots, 1.0), kv.t, name="prefill_store_kv",
              writes=[kv.rows(slots)])
    rt.launch(fwd, lambda o, k: o.copy_(k[4:8]), attn_out.t, kv.t, name="decode_batch_i",
              reads=[kv.rows(slots)], writes=[attn_out])
    # Batch i-1's result: req-A finished, its slots are freed and handed to req-C.
    rt.transfer(kv, slots, None)
    rt.transfer(kv, slots, "req-C")
    writer = fwd if fixed else sched
    rt.launch(writer, _fill_rows(slots, 2.0), kv.t, name="store_kv_req_c",
              writes=[kv.rows(slots)])


@pair("overlapping_annotated_rows", "disjoint_annotated_rows",
      kinds=(STREAM_STREAM,), annotated=True, sanitizer=True,
      race="schedule stream writes req_to_token rows of admitted requests while the forward "
           "stream writes draft-slot rows, and one row is in both sets",
      twin="the two streams write disjoint, correctly annotated req_to_token rows")
def _rows(rt, fixed):
    sched, fwd = rt.new_stream("schedule"), rt.new_stream("forward")
    req_to_token = rt.empty((8, 8), I64, "req_to_token", sched)
    fwd.wait_stream(sched)
    admitted, drafts = [0, 1], ([2, 3] if fixed else [1, 2])
    rt.launch(sched, _fill_rows(admitted, 5), req_to_token.t, name="prepare_admitted",
              writes=[req_to_token.rows(admitted)])
    rt.launch(fwd, _fill_rows(drafts, 9), req_to_token.t, name="assign_draft_slots",
              writes=[req_to_token.rows(drafts)])


@pair("wrong_annotation_hides_row", "annotation_covers_touched_rows",
      kinds=(ANNOTATION,), annotated=True, sanitizer=True,
      race="the forward kernel declares req_to_token rows [0, 1] but also writes row 3 "
           "(off by one slot), which the schedule stream is writing",
      twin="the forward kernel writes exactly the rows [0, 1] it declares")
def _wrong_annotation(rt, fixed):
    sched, fwd = rt.new_stream("schedule"), rt.new_stream("forward")
    req_to_token = rt.empty((8, 8), I64, "req_to_token", sched)
    fwd.wait_stream(sched)
    rt.launch(sched, _fill_rows([3], 5), req_to_token.t, name="prepare_admitted",
              writes=[req_to_token.rows([3])])
    touched = [0, 1] if fixed else [0, 1, 3]
    rt.launch(fwd, _fill_rows(touched, 9), req_to_token.t, name="assign_draft_slots",
              writes=[req_to_token.rows([0, 1])])
