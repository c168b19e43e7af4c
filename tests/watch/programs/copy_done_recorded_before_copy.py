"""``copy_done`` is recorded on the copy stream before the device-to-host copy is
issued, so synchronizing it does not cover the copy.

Twin (``--fixed``): record ``copy_done`` after the copy.
"""
import sys

import torch

KINDS = ("host-read-before-copy",)
SANITIZER = False
BUG = None
SELFTEST = "copy_done_recorded_before_copy"


def main(fixed: bool) -> None:
    forward, copy = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(forward):
        output_tokens = torch.empty(4, dtype=torch.int64, device="cuda")
        output_tokens.fill_(42)  # sample
    output_tokens_pinned = torch.empty(4, dtype=torch.int64, pin_memory=True)
    copy_done = torch.cuda.Event()
    copy.wait_stream(forward)
    if not fixed:
        copy_done.record(copy)
    with torch.cuda.stream(copy):
        output_tokens_pinned.copy_(output_tokens, non_blocking=True)
    if fixed:
        copy_done.record(copy)
    copy_done.synchronize()
    output_tokens_pinned.tolist()


if __name__ == "__main__":
    main(fixed="--fixed" in sys.argv[1:])
