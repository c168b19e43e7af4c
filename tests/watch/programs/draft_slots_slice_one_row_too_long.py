"""The forward stream assigns draft slots through a slice one row too long
(``req_to_token[0:4]`` for rows 0..1 and the padding row), which covers row 3, which
the schedule stream is writing for an admitted request.

The selftest's planted case is an annotation that hides row 3; plain PyTorch has no
annotations, and the same off-by-one reaches the memory through a view. The views
start at different addresses, so PyTorch's CUDA sanitizer, which keys accesses by the
view's data pointer, does not connect them.

Twin (``--fixed``): the slice covers exactly rows 0..1.
"""
import sys

import torch

KINDS = ("stream-stream",)
SANITIZER = False
BUG = None
SELFTEST = "wrong_annotation_hides_row"


def main(fixed: bool) -> None:
    schedule, forward = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(schedule):
        req_to_token = torch.empty(8, 8, dtype=torch.int64, device="cuda")
    forward.wait_stream(schedule)
    with torch.cuda.stream(schedule):
        req_to_token[3].fill_(5)  # prepare_admitted: row 3
    end = 2 if fixed else 4
    with torch.cuda.stream(forward):
        req_to_token[0:end].fill_(9)  # assign_draft_slots: rows 0..1


if __name__ == "__main__":
    main(fixed="--fixed" in sys.argv[1:])
