"""The non-blocking device-to-host copy of ``next_token_ids`` is issued on the copy
stream without waiting for the forward stream that writes them.

Twin (``--fixed``): the copy stream waits for the forward stream first.
"""
import sys

import torch

KINDS = ("stream-stream",)
SANITIZER = True
BUG = None
SELFTEST = "copy_stream_missing_wait_on_forward"


def main(fixed: bool) -> None:
    forward, copy = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(forward):
        next_token_ids = torch.empty(4, dtype=torch.int64, device="cuda")
        torch.arange(100, 104, out=next_token_ids)  # sample
    next_token_ids_pinned = torch.empty(4, dtype=torch.int64, pin_memory=True)
    copy_done = torch.cuda.Event()
    if fixed:
        copy.wait_stream(forward)
    with torch.cuda.stream(copy):
        next_token_ids_pinned.copy_(next_token_ids, non_blocking=True)
    copy_done.record(copy)
    copy_done.synchronize()
    next_token_ids_pinned.tolist()


if __name__ == "__main__":
    main(fixed="--fixed" in sys.argv[1:])
