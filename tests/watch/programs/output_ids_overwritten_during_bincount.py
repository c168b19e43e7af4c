"""The schedule stream writes the next step's tokens into the output-id buffer while
the forward stream's ``bincount`` (token counts for a repetition penalty) may still
be reading it: ``bincount`` makes the host wait for the largest id to size its
result, then counts with a kernel queued after that wait, which nothing waits for.

Twin (``--fixed``): the schedule stream waits for the forward stream before writing
the buffer.
"""
import sys

import torch

KINDS = ("stream-stream",)
SANITIZER = True
BUG = None
SELFTEST = None


def main(fixed: bool) -> None:
    forward, schedule = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(schedule):
        output_ids = torch.tensor([3, 9, 3, 2, 9, 9], device="cuda")
    forward.wait_stream(schedule)
    with torch.cuda.stream(forward):
        token_counts = torch.bincount(output_ids, minlength=16)
    if fixed:
        schedule.wait_stream(forward)
    with torch.cuda.stream(schedule):
        output_ids[:2].fill_(5)  # the next step's tokens
    del token_counts


if __name__ == "__main__":
    main(fixed="--fixed" in sys.argv[1:])
