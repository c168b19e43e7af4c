"""``req_pool_indices``, made on the schedule stream, is freed while the forward stream
reads it, without ``record_stream``: the caching allocator hands its block to the next
batch's indices on the schedule stream at once.

Twin (``--fixed``): ``indices.record_stream(forward)`` before the free keeps the block
from the schedule stream until the forward stream's work is done.
"""
import sys

import torch

KINDS = ("reuse",)
SANITIZER = False
BUG = None
SELFTEST = "index_tensor_freed_without_record_stream"


def main(fixed: bool) -> None:
    schedule, forward = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(schedule):
        req_to_token = torch.empty(4, 8, dtype=torch.int64, device="cuda")
        req_to_token.fill_(6)
        indices = torch.arange(0, 2, device="cuda")  # req_pool_indices of batch N
    with torch.cuda.stream(forward):
        positions = torch.empty(2, 8, dtype=torch.int64, device="cuda")
    forward.wait_stream(schedule)
    with torch.cuda.stream(forward):
        positions.copy_(req_to_token.index_select(0, indices))  # forward gathers
    if fixed:
        indices.record_stream(forward)
    del indices
    with torch.cuda.stream(schedule):
        following = torch.arange(2, 4, device="cuda")  # req_pool_indices of batch N+1
    del following


if __name__ == "__main__":
    main(fixed="--fixed" in sys.argv[1:])
