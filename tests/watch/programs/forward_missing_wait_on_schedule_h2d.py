"""The forward stream reads ``input_ids`` while the schedule stream's non-blocking
host-to-device copy into them is unordered with it.

Twin (``--fixed``): the forward stream waits for the schedule stream first.
"""
import sys

import torch

KINDS = ("stream-stream",)
SANITIZER = True
BUG = None
SELFTEST = "forward_missing_wait_on_schedule_h2d"


def main(fixed: bool) -> None:
    schedule, forward = torch.cuda.Stream(), torch.cuda.Stream()
    input_ids_pinned = torch.empty(4, dtype=torch.int64, pin_memory=True)
    with torch.cuda.stream(schedule):
        input_ids = torch.empty(4, dtype=torch.int64, device="cuda")
    with torch.cuda.stream(forward):
        input_embeds = torch.empty(4, dtype=torch.int64, device="cuda")
    input_ids_pinned[:] = torch.tensor([11, 12, 13, 14])
    with torch.cuda.stream(schedule):
        input_ids.copy_(input_ids_pinned, non_blocking=True)
    if fixed:
        forward.wait_stream(schedule)
    with torch.cuda.stream(forward):
        input_embeds.copy_(input_ids * 3)  # embed


if __name__ == "__main__":
    main(fixed="--fixed" in sys.argv[1:])
