"""SGLang #26380: in overlap scheduling the schedule stream writes shared GPU buffers
(``req_to_token`` rows from allocation) while the previous forward, on the forward
stream, still reads them: a write-after-read hazard between the two streams.

The forward stream waits for the schedule stream (read-after-write is covered), but
nothing made the schedule stream wait for the forward stream. The PR adds a WAR
barrier, ``schedule_stream.wait_stream(forward_stream)``, at the top of each overlap
loop iteration.

Twin (``--fixed``): the WAR barrier.
"""
import sys

import torch

KINDS = ("stream-stream",)
SANITIZER = True
BUG = "SGLang #26380"
SELFTEST = None


def main(fixed: bool) -> None:
    schedule_stream, forward_stream = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(schedule_stream):
        req_to_token = torch.zeros(8, 16, dtype=torch.int32, device="cuda")
    for it in range(3):
        if fixed:
            schedule_stream.wait_stream(forward_stream)  # the WAR barrier
        with torch.cuda.stream(schedule_stream):
            # alloc for the batch: rows of finished requests go to new ones
            req_pool_indices = torch.arange(it, it + 2, device="cuda")
            rows = torch.arange(16, dtype=torch.int32, device="cuda").repeat(2, 1) + it
            req_to_token.index_copy_(0, req_pool_indices, rows)
        forward_stream.wait_stream(schedule_stream)
        with torch.cuda.stream(forward_stream):
            # attention metadata: the forward gathers its page table from req_to_token
            page_table = req_to_token.index_select(0, req_pool_indices)
            req_pool_indices.record_stream(forward_stream)
            del page_table


if __name__ == "__main__":
    main(fixed="--fixed" in sys.argv[1:])
