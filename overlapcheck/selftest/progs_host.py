"""Host<->copy programs: the host reads pinned buffers filled by non-blocking D2H copies
and rewrites pinned H2D staging buffers. PyTorch's CUDA sanitizer cannot see these:
host memory accesses are not CUDA kernels."""
from __future__ import annotations

import torch

from .cases import HOST_READ_BEFORE_COPY, HOST_WRITE_DURING_COPY, pair, poll

I64 = torch.int64
HRBC, HWDC = (HOST_READ_BEFORE_COPY,), (HOST_WRITE_DURING_COPY,)


def _accept_step(rt, name: str = "accept_lens", pinned: bool = True):
    """Forward writes ``name`` on the device; the copy stream waits for it and starts a
    non-blocking D2H into a host buffer. Returns (streams, host buffer, events)."""
    fwd, copy = rt.new_stream("forward"), rt.new_stream("copy")
    dev = rt.empty((4,), I64, name, fwd)
    host = rt.host_empty((4,), I64, f"{name}_{'pinned' if pinned else 'pageable'}",
                         pinned=pinned)
    forward_done, copy_done = rt.new_event("forward_done"), rt.new_event("copy_done")
    rt.launch(fwd, lambda t: torch.arange(1, 5, out=t), dev.t, name="verify_accept")
    forward_done.record(fwd)
    copy.wait_stream(fwd)
    rt.copy(host, dev, copy, non_blocking=True)
    copy_done.record(copy)
    return (fwd, copy), host, (forward_done, copy_done)


@pair("accept_lens_read_before_copy_done", "accept_lens_read_after_copy_done",
      kinds=HRBC,
      race="result processing reads the pinned accept-length buffer (.tolist()) before "
           "the copy-done event of its non-blocking D2H",
      twin="result processing synchronizes the copy-done event, then reads")
def _accept_lens(rt, fixed):
    _, pinned, (_, copy_done) = _accept_step(rt)
    if fixed:
        copy_done.synchronize()
    rt.host_view(pinned)


@pair("host_polls_forward_event_not_copy", "event_query_true_is_sync",
      kinds=HRBC,
      race="the host busy-waits on the forward-done event, which says nothing about the "
           "copy stream's D2H, then reads the pinned buffer",
      twin="copy_done.query() returning true orders the copy before the host's read")
def _query(rt, fixed):
    _, pinned, (forward_done, copy_done) = _accept_step(rt)
    poll(copy_done if fixed else forward_done)
    rt.host_view(pinned)


@pair("nonblocking_copy_to_pinned_is_async", "nonblocking_copy_to_pageable_is_sync",
      kinds=HRBC,
      race="non_blocking D2H into pinned memory returns at once: reading it right after "
           "the call sees stale values",
      twin="non_blocking D2H into pageable memory is synchronous: reading after it is safe")
def _pageable(rt, fixed):
    _, host, _ = _accept_step(rt, "output_ids", pinned=not fixed)
    rt.host_view(host)


@pair("seq_lens_sum_from_inflight_copy", "seq_lens_sum_after_verify_sync",
      kinds=HRBC,
      race="with the wait-for-verify sync removed, seq_lens_sum for the next batch is "
           "summed on the host from the in-flight pinned seq_lens",
      twin="the host synchronizes the copy stream (wait for verify) before summing")
def _seq_lens_sum(rt, fixed):
    (_, copy), seq_lens_cpu, _ = _accept_step(rt, "seq_lens")
    if fixed:
        copy.synchronize()
    int(rt.host_view(seq_lens_cpu).sum())


@pair("h2d_staging_rewritten_before_copy", "h2d_staging_rewritten_after_copy_event",
      kinds=HWDC,
      race="the host fills the pinned input-ids staging buffer for batch i+1 while batch "
           "i's non-blocking H2D copy from it may still run",
      twin="the host synchronizes the staging copy's event before refilling the buffer")
def _staging(rt, fixed):
    sched = rt.new_stream("schedule")
    staging = rt.host_empty((4,), I64, "input_ids_pinned")
    input_ids = rt.empty((4,), I64, "input_ids", sched)
    staged = rt.new_event("h2d_done")
    rt.host_write(staging, [5, 6, 7, 8])
    rt.copy(input_ids, staging, sched, non_blocking=True)
    staged.record(sched)
    if fixed:
        staged.synchronize()
    rt.host_write(staging, [9, 10, 11, 12])
    rt.copy(input_ids, staging, sched, non_blocking=True)


@pair("copy_done_recorded_before_copy", "copy_done_recorded_after_copy",
      kinds=HRBC,
      race="copy_done is recorded on the copy stream before the D2H is issued, so "
           "waiting on it does not cover the copy",
      twin="copy_done is recorded after the D2H on the copy stream")
def _record_place(rt, fixed):
    fwd, copy = rt.new_stream("forward"), rt.new_stream("copy")
    tokens = rt.empty((4,), I64, "output_tokens", fwd)
    pinned = rt.host_empty((4,), I64, "output_tokens_pinned")
    copy_done = rt.new_event("copy_done")
    rt.launch(fwd, lambda t: t.fill_(42), tokens.t, name="sample")
    copy.wait_stream(fwd)
    if not fixed:
        copy_done.record(copy)
    rt.copy(pinned, tokens, copy, non_blocking=True)
    if fixed:
        copy_done.record(copy)
    copy_done.synchronize()
    rt.host_view(pinned)
