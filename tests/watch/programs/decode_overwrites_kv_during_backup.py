"""The next decode writes the KV buffer while the previous step's backup copy still
reads it (the pending backup is not waited for).

Twin (``--fixed``): the next decode's stream waits on the pending backup-done event.
"""
import sys

import torch

KINDS = ("stream-stream",)
SANITIZER = True
BUG = None
SELFTEST = "decode_overwrites_kv_during_backup"


def store_kv(stream, kv, first: int) -> None:
    with torch.cuda.stream(stream):
        out_cache_loc = torch.arange(first, first + 4, device="cuda")
        new_kv = torch.ones(4, kv.shape[1], device="cuda")
        kv.index_copy_(0, out_cache_loc, new_kv)


def main(fixed: bool) -> None:
    forward, backup = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(forward):
        kv = torch.empty(16, 4, device="cuda")
    host_kv_pool = torch.empty(16, 4, pin_memory=True)
    forward_done, backup_done = torch.cuda.Event(), torch.cuda.Event()
    store_kv(forward, kv, 0)  # decode step n
    forward_done.record(forward)
    backup.wait_event(forward_done)
    with torch.cuda.stream(backup):
        host_kv_pool.copy_(kv, non_blocking=True)
    backup_done.record(backup)
    if fixed:
        forward.wait_event(backup_done)  # wait_for_pending_backup
    store_kv(forward, kv, 4)  # decode step n+1


if __name__ == "__main__":
    main(fixed="--fixed" in sys.argv[1:])
