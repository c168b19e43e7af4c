"""A finished request's KV slots, freed while batch i still reads them, are refilled
for a new request by a prefix load on the schedule stream.

Twin (``--fixed``): the same slots are next written on the forward stream, after batch
i (stream order makes the reuse safe).
"""
import sys

import torch

KINDS = ("stream-stream",)
SANITIZER = True
BUG = None
SELFTEST = "kv_slots_reused_by_schedule_stream"


def main(fixed: bool) -> None:
    schedule, forward = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(forward):
        kv_cache = torch.empty(16, 4, device="cuda")
        attn_out = torch.empty(4, 4, device="cuda")
        kv_cache[4:8].fill_(1.0)  # prefill stores request A's KV in slots 4..7
        attn_out.copy_(kv_cache[4:8])  # decode batch i reads them
    # batch i-1's result: A finished; its slots are freed and handed to request C
    writer = forward if fixed else schedule
    with torch.cuda.stream(writer):
        kv_cache[4:8].fill_(2.0)  # store_kv for request C


if __name__ == "__main__":
    main(fixed="--fixed" in sys.argv[1:])
