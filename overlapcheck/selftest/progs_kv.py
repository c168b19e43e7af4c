"""KV-cache programs between streams: the hierarchical-cache backup stream and the
frozen-KV MTP draft, both reading KV that the forward (verify) stream writes."""
from __future__ import annotations

import torch

from .cases import STREAM_STREAM, pair

I64, F32 = torch.int64, torch.float32
SS = (STREAM_STREAM,)
SLOTS, HEAD = 16, 4


def _kv_write(rt, stream, kv, first: int, name: str) -> None:
    """Write 4 new tokens' KV at slots ``first..first+3`` on ``stream`` (an index_copy_
    over the whole KV buffer, as a paged-attention store kernel does)."""
    loc = rt.empty((4,), I64, f"{name}_out_cache_loc", stream)
    new = rt.empty((4, HEAD), F32, f"{name}_new_kv", stream)
    rt.launch(stream, lambda l, n: (torch.arange(first, first + 4, out=l), n.fill_(1.0)),
              loc.t, new.t, name=f"{name}_prepare")
    rt.launch(stream, lambda k, l, n: k.index_copy_(0, l, n), kv.t, loc.t, new.t,
              name=f"{name}_store_kv")


@pair("kv_backup_without_forward_done", "kv_backup_after_forward_done",
      kinds=SS, sanitizer=True,
      race="decode KV backup to the host pool runs on the backup stream without waiting "
           "for the forward pass that writes the KV",
      twin="the backup stream waits on the decode forward's done-event before copying")
def _backup(rt, fixed):
    fwd, backup = rt.new_stream("forward"), rt.new_stream("backup")
    kv = rt.empty((SLOTS, HEAD), F32, "decode_kv", fwd)
    host_pool = rt.host_empty((SLOTS, HEAD), F32, "host_kv_pool")
    forward_done, backup_done = rt.new_event("decode_forward_done"), rt.new_event("backup_done")
    _kv_write(rt, fwd, kv, 4, "decode")
    forward_done.record(fwd)
    if fixed:
        backup.wait_event(forward_done)
    rt.copy(host_pool, kv, backup, non_blocking=True, name="backup_from_device_all_layer")
    backup_done.record(backup)
    backup_done.synchronize()


@pair("decode_overwrites_kv_during_backup", "decode_waits_for_pending_backup",
      kinds=SS, sanitizer=True,
      race="next decode writes the KV buffer while the previous step's backup copy still "
           "reads it (pending backup not waited for)",
      twin="the next decode waits on the pending backup-done event first")
def _pending_backup(rt, fixed):
    fwd, backup = rt.new_stream("forward"), rt.new_stream("backup")
    kv = rt.empty((SLOTS, HEAD), F32, "decode_kv", fwd)
    host_pool = rt.host_empty((SLOTS, HEAD), F32, "host_kv_pool")
    forward_done, backup_done = rt.new_event("decode_forward_done"), rt.new_event("backup_done")
    _kv_write(rt, fwd, kv, 0, "decode_n")
    forward_done.record(fwd)
    backup.wait_event(forward_done)
    rt.copy(host_pool, kv, backup, non_blocking=True, name="backup_from_device_all_layer")
    backup_done.record(backup)
    if fixed:
        fwd.wait_event(backup_done)  # wait_for_pending_backup
    _kv_write(rt, fwd, kv, 4, "decode_n1")


@pair("mtp_draft_reads_kv_during_verify", "mtp_draft_waits_for_verify",
      kinds=SS, sanitizer=True,
      race="frozen-KV MTP draft reads target KV slots on its own stream while the same "
           "step's verify writes them",
      twin="the MTP draft stream waits on verify_done before reading the target KV")
def _mtp(rt, fixed):
    fwd, draft = rt.new_stream("forward"), rt.new_stream("mtp_draft")
    target_kv = rt.empty((SLOTS, HEAD), F32, "target_kv", fwd)
    seed_loc = rt.empty((4,), I64, "mtp_seed_loc", draft)
    seed_kv = rt.empty((4, HEAD), F32, "mtp_seed_kv", draft)
    verify_done = rt.new_event("verify_done")
    _kv_write(rt, fwd, target_kv, 8, "verify")
    verify_done.record(fwd)
    if fixed:
        draft.wait_event(verify_done)
    rt.launch(draft, lambda l: torch.arange(8, 12, out=l), seed_loc.t, name="seed_positions")
    rt.launch(draft, lambda s, k, l: s.copy_(k.index_select(0, l)), seed_kv.t,
              target_kv.t, seed_loc.t, name="mtp_read_frozen_kv")
