"""The decode KV backup to the host pool runs on the backup stream without waiting for
the forward pass that writes the KV.

Twin (``--fixed``): the backup stream waits on the decode forward's done-event first.
"""
import sys

import torch

KINDS = ("stream-stream",)
SANITIZER = True
BUG = None
SELFTEST = "kv_backup_without_forward_done"


def store_kv(stream, kv, first: int) -> None:
    """Write 4 new tokens' KV at slots first..first+3, as a paged-attention store does."""
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
    store_kv(forward, kv, 4)
    forward_done.record(forward)
    if fixed:
        backup.wait_event(forward_done)
    with torch.cuda.stream(backup):
        host_kv_pool.copy_(kv, non_blocking=True)  # backup_from_device_all_layer
    backup_done.record(backup)
    backup_done.synchronize()


if __name__ == "__main__":
    main(fixed="--fixed" in sys.argv[1:])
