"""The schedule stream writes ``req_to_token`` rows of admitted requests while the
forward stream writes draft-slot rows, and one row is in both sets.

Twin (``--fixed``): the two streams write disjoint rows.
"""
import sys

import torch

KINDS = ("stream-stream",)
SANITIZER = True
BUG = None
SELFTEST = "overlapping_annotated_rows"


def main(fixed: bool) -> None:
    schedule, forward = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(schedule):
        req_to_token = torch.empty(8, 8, dtype=torch.int64, device="cuda")
    forward.wait_stream(schedule)
    admitted, drafts = [0, 1], ([2, 3] if fixed else [1, 2])
    with torch.cuda.stream(schedule):
        for r in admitted:
            req_to_token[r].fill_(5)  # prepare_admitted
    with torch.cuda.stream(forward):
        for r in drafts:
            req_to_token[r].fill_(9)  # assign_draft_slots


if __name__ == "__main__":
    main(fixed="--fixed" in sys.argv[1:])
