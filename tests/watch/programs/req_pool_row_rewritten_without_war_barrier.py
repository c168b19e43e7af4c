"""A finished request's ``req_to_token`` row is handed to a new request and rewritten
on the schedule stream while forward N still reads it (no WAR barrier).

Twin (``--fixed``): the schedule stream waits for forward N (the WAR barrier) before
rewriting the row.
"""
import sys

import torch

KINDS = ("stream-stream",)
SANITIZER = True
BUG = None
SELFTEST = "req_pool_row_rewritten_without_war_barrier"


def main(fixed: bool) -> None:
    schedule, forward = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(schedule):
        req_to_token = torch.empty(4, 8, dtype=torch.int64, device="cuda")
    with torch.cuda.stream(forward):
        out_cache_loc = torch.empty(8, dtype=torch.int64, device="cuda")
    forward_done = torch.cuda.Event()
    with torch.cuda.stream(schedule):
        req_to_token[1].fill_(3)  # prepare_decode for request A (row 1)
    forward.wait_stream(schedule)
    with torch.cuda.stream(forward):
        out_cache_loc.copy_(req_to_token[1])  # forward batch N reads A's row
    forward_done.record(forward)
    # processing batch N-1's result: A finished, request B gets row 1
    if fixed:
        schedule.wait_event(forward_done)
    with torch.cuda.stream(schedule):
        req_to_token[1].fill_(7)  # prepare_prefill for B


if __name__ == "__main__":
    main(fixed="--fixed" in sys.argv[1:])
