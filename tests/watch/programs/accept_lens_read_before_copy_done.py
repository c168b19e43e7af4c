"""Result processing reads the pinned accept-length buffer (``.tolist()``) before the
copy-done event of its non-blocking device-to-host copy.

Twin (``--fixed``): synchronize the copy-done event, then read.
"""
import sys

import torch

KINDS = ("host-read-before-copy",)
SANITIZER = False
BUG = None
SELFTEST = "accept_lens_read_before_copy_done"


def main(fixed: bool) -> None:
    forward, copy = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(forward):
        accept_lens = torch.empty(4, dtype=torch.int64, device="cuda")
        torch.arange(1, 5, out=accept_lens)  # verify: accept lengths of the batch
    accept_lens_pinned = torch.empty(4, dtype=torch.int64, pin_memory=True)
    copy_done = torch.cuda.Event()
    copy.wait_stream(forward)
    with torch.cuda.stream(copy):
        accept_lens_pinned.copy_(accept_lens, non_blocking=True)
    copy_done.record(copy)
    if fixed:
        copy_done.synchronize()
    lens = accept_lens_pinned.tolist()
    assert len(lens) == 4


if __name__ == "__main__":
    main(fixed="--fixed" in sys.argv[1:])
