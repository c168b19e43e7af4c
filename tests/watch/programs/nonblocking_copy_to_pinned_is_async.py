"""A ``non_blocking`` device-to-host copy into pinned memory returns at once: reading
the buffer right after the call can see stale values.

Twin (``--fixed``): the same copy into pageable memory, which CUDA completes before
returning, so the read after it is safe.
"""
import sys

import torch

KINDS = ("host-read-before-copy",)
SANITIZER = False
BUG = None
SELFTEST = "nonblocking_copy_to_pinned_is_async"


def main(fixed: bool) -> None:
    forward = torch.cuda.Stream()
    with torch.cuda.stream(forward):
        output_ids = torch.empty(4, dtype=torch.int64, device="cuda")
        torch.arange(7, 11, out=output_ids)
        host = torch.empty(4, dtype=torch.int64, pin_memory=not fixed)
        host.copy_(output_ids, non_blocking=True)
    host.tolist()


if __name__ == "__main__":
    main(fixed="--fixed" in sys.argv[1:])
