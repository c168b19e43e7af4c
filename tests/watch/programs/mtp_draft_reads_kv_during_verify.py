"""A frozen-KV MTP draft reads target KV slots on its own stream while the same
step's verify writes them.

Twin (``--fixed``): the MTP draft stream waits on ``verify_done`` before reading.
"""
import sys

import torch

KINDS = ("stream-stream",)
SANITIZER = True
BUG = None
SELFTEST = "mtp_draft_reads_kv_during_verify"


def main(fixed: bool) -> None:
    forward, draft = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(forward):
        target_kv = torch.empty(16, 4, device="cuda")
        out_cache_loc = torch.arange(8, 12, device="cuda")
        target_kv.index_copy_(0, out_cache_loc, torch.ones(4, 4, device="cuda"))  # verify
    verify_done = torch.cuda.Event()
    verify_done.record(forward)
    if fixed:
        draft.wait_event(verify_done)
    with torch.cuda.stream(draft):
        seed_loc = torch.arange(8, 12, device="cuda")
        seed_kv = target_kv.index_select(0, seed_loc)  # mtp_read_frozen_kv
        del seed_kv


if __name__ == "__main__":
    main(fixed="--fixed" in sys.argv[1:])
