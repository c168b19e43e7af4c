"""The host fills the pinned input-ids staging buffer for batch i+1 while batch i's
non-blocking host-to-device copy from it may still run.

Twin (``--fixed``): synchronize the staging copy's event before refilling the buffer.
"""
import sys

import torch

KINDS = ("host-write-during-copy",)
SANITIZER = False
BUG = None
SELFTEST = "h2d_staging_rewritten_before_copy"


def main(fixed: bool) -> None:
    schedule = torch.cuda.Stream()
    staging = torch.empty(4, dtype=torch.int64, pin_memory=True)
    with torch.cuda.stream(schedule):
        input_ids = torch.empty(4, dtype=torch.int64, device="cuda")
    staged = torch.cuda.Event()
    for batch in ([5, 6, 7, 8], [9, 10, 11, 12]):
        if fixed:
            staged.synchronize()  # a no-op before the first record, as in CUDA
        staging[:] = torch.tensor(batch)
        with torch.cuda.stream(schedule):
            input_ids.copy_(staging, non_blocking=True)
        staged.record(schedule)


if __name__ == "__main__":
    main(fixed="--fixed" in sys.argv[1:])
