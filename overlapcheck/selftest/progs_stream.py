"""Stream<->stream programs: two streams touch one device buffer, and an event or stream
wait orders them (twin) or fails to (planted race). These accesses are whole CUDA
tensors, so PyTorch's CUDA sanitizer sees them too."""
from __future__ import annotations

import torch

from .cases import STREAM_STREAM, pair

I64, F32 = torch.int64, torch.float32
SS = (STREAM_STREAM,)


@pair("future_map_resolve_without_stash_event", "future_map_resolve_after_stash_event",
      kinds=SS, sanitizer=True,
      race="draft stream resolves step N+1's FutureMap rows before forward N's stash is "
           "ordered before it (no wait on the stash event)",
      twin="draft stream waits on the stash-done event before resolving the FutureMap")
def _future_map(rt, fixed):
    fwd, draft = rt.new_stream("forward"), rt.new_stream("draft")
    future_map = rt.empty((4, 2), I64, "future_map", fwd)
    draft_input = rt.empty((4, 2), I64, "draft_input", draft)
    stash_done = rt.new_event("stash_done")
    rt.launch(fwd, lambda m: m.fill_(17), future_map.t, name="stash_next_draft_input")
    stash_done.record(fwd)
    if fixed:
        draft.wait_event(stash_done)
    rt.launch(draft, lambda d, m: d.copy_(m), draft_input.t, future_map.t,
              name="resolve_future_map")


@pair("copy_stream_missing_wait_on_forward", "copy_stream_waits_on_forward",
      kinds=SS, sanitizer=True,
      race="non-blocking D2H of next_token_ids issued on the copy stream without waiting "
           "for the forward stream that writes them",
      twin="copy stream waits for the forward stream before the D2H of next_token_ids")
def _copy_wait(rt, fixed):
    fwd, copy = rt.new_stream("forward"), rt.new_stream("copy")
    next_ids = rt.empty((4,), I64, "next_token_ids", fwd)
    pinned = rt.host_empty((4,), I64, "next_token_ids_pinned")
    copy_done = rt.new_event("copy_done")
    rt.launch(fwd, lambda t: torch.arange(100, 104, out=t), next_ids.t, name="sample")
    if fixed:
        copy.wait_stream(fwd)
    rt.copy(pinned, next_ids, copy, non_blocking=True)
    copy_done.record(copy)
    copy_done.synchronize()
    rt.host_view(pinned)


@pair("wait_bound_to_older_record", "wait_after_record",
      kinds=SS, sanitizer=True,
      race="draft-extend waits on verify_done before this step's verify records it: the "
           "wait binds to the previous step's record",
      twin="verify records verify_done first, then draft-extend waits on it")
def _older_record(rt, fixed):
    fwd, draft = rt.new_stream("forward"), rt.new_stream("draft")
    logits = rt.empty((4, 8), F32, "verify_logits", fwd)
    hidden = rt.empty((4, 8), F32, "draft_hidden", draft)
    verify_done = rt.new_event("verify_done")
    verify_done.record(fwd)  # the previous step's record
    if not fixed:
        draft.wait_event(verify_done)
    rt.launch(fwd, lambda t: t.fill_(0.5), logits.t, name="verify")
    verify_done.record(fwd)
    if fixed:
        draft.wait_event(verify_done)
    rt.launch(draft, lambda h, x: h.copy_(x * 2), hidden.t, logits.t, name="draft_extend")


@pair("wait_on_never_recorded_event", "wait_on_recorded_event",
      kinds=SS, sanitizer=True,
      race="draft stream waits on an event that was never recorded (a no-op in CUDA), "
           "then reads what the forward stream writes",
      twin="the forward stream records the event before the draft stream waits on it")
def _never_recorded(rt, fixed):
    fwd, draft = rt.new_stream("forward"), rt.new_stream("draft")
    accept_lens = rt.empty((4,), I64, "accept_lens", fwd)
    seq_lens = rt.empty((4,), I64, "draft_seq_lens", draft)
    accepted = rt.new_event("accept_done")
    if not fixed:
        draft.wait_event(accepted)
    rt.launch(fwd, lambda t: t.fill_(3), accept_lens.t, name="accept")
    accepted.record(fwd)
    if fixed:
        draft.wait_event(accepted)
    rt.launch(draft, lambda s, a: s.copy_(a + 16), seq_lens.t, accept_lens.t,
              name="advance_seq_lens")


@pair("to_host_on_schedule_stream", "to_host_on_forward_stream",
      kinds=SS, sanitizer=True,
      race="accept lengths read back (.tolist()) in the schedule stream's order while the "
           "forward stream still writes them",
      twin="the blocking read-back is issued in the forward stream's order")
def _to_host(rt, fixed):
    sched, fwd = rt.new_stream("schedule"), rt.new_stream("forward")
    accept_lens = rt.empty((4,), I64, "accept_lens", fwd)
    rt.launch(fwd, lambda t: t.fill_(2), accept_lens.t, name="accept")
    rt.to_host(accept_lens, fwd if fixed else sched)


@pair("forward_missing_wait_on_schedule_h2d", "forward_waits_on_schedule_h2d",
      kinds=SS, sanitizer=True,
      race="forward stream reads input_ids while the schedule stream's non-blocking H2D "
           "copy into them is unordered with it",
      twin="forward stream waits for the schedule stream before reading input_ids")
def _h2d_wait(rt, fixed):
    sched, fwd = rt.new_stream("schedule"), rt.new_stream("forward")
    staging = rt.host_empty((4,), I64, "input_ids_pinned")
    input_ids = rt.empty((4,), I64, "input_ids", sched)
    embeds = rt.empty((4,), I64, "input_embeds", fwd)
    rt.host_write(staging, [11, 12, 13, 14])
    rt.copy(input_ids, staging, sched, non_blocking=True)
    if fixed:
        fwd.wait_stream(sched)
    rt.launch(fwd, lambda e, i: e.copy_(i * 3), embeds.t, input_ids.t, name="embed")
