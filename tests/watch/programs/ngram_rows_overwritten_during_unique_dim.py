"""The schedule stream rewrites the n-gram table while the forward stream's
``torch.unique(..., dim=0)`` may still be reading it: unique over a dimension makes the
host wait for the number of distinct rows, then gathers them from the table with a
kernel queued after that wait, which nothing waits for. (A flat ``torch.unique`` does
all its work before its wait, so the same rewrite after it would be ordered.)

Twin (``--fixed``): the schedule stream waits for the forward stream before rewriting
the table.
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
        ngrams = torch.tensor([[3, 4], [5, 6], [3, 4], [7, 8]], device="cuda")
    forward.wait_stream(schedule)
    with torch.cuda.stream(forward):
        distinct, counts = torch.unique(ngrams, dim=0, return_counts=True)
    if fixed:
        schedule.wait_stream(forward)
    with torch.cuda.stream(schedule):
        ngrams[:2].fill_(0)  # the next step's n-grams
    del distinct, counts


if __name__ == "__main__":
    main(fixed="--fixed" in sys.argv[1:])
