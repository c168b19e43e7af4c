"""The host busy-waits on the forward-done event, which says nothing about the copy
stream's device-to-host copy, then reads the pinned buffer.

Twin (``--fixed``): poll the copy-done event instead; ``query()`` answering True
orders the copy before the host's read.
"""
import sys

import torch

KINDS = ("host-read-before-copy",)
SANITIZER = False
BUG = None
SELFTEST = "host_polls_forward_event_not_copy"


def main(fixed: bool) -> None:
    forward, copy = torch.cuda.Stream(), torch.cuda.Stream()
    forward_done, copy_done = torch.cuda.Event(), torch.cuda.Event()
    with torch.cuda.stream(forward):
        accept_lens = torch.empty(4, dtype=torch.int64, device="cuda")
        torch.arange(1, 5, out=accept_lens)
    forward_done.record(forward)
    accept_lens_pinned = torch.empty(4, dtype=torch.int64, pin_memory=True)
    copy.wait_stream(forward)
    with torch.cuda.stream(copy):
        accept_lens_pinned.copy_(accept_lens, non_blocking=True)
    copy_done.record(copy)
    done = copy_done if fixed else forward_done
    while not done.query():
        pass
    accept_lens_pinned.tolist()


if __name__ == "__main__":
    main(fixed="--fixed" in sys.argv[1:])
