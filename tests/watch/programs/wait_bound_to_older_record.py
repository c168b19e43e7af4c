"""Draft-extend waits on ``verify_done`` before this step's verify records it: the
wait binds to the previous step's record.

Twin (``--fixed``): verify records ``verify_done`` first, then draft-extend waits.
"""
import sys

import torch

KINDS = ("stream-stream",)
SANITIZER = True
BUG = None
SELFTEST = "wait_bound_to_older_record"


def main(fixed: bool) -> None:
    forward, draft = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(forward):
        verify_logits = torch.empty(4, 8, device="cuda")
    with torch.cuda.stream(draft):
        draft_hidden = torch.empty(4, 8, device="cuda")
    verify_done = torch.cuda.Event()
    verify_done.record(forward)  # the previous step's record
    if not fixed:
        draft.wait_event(verify_done)
    with torch.cuda.stream(forward):
        verify_logits.fill_(0.5)  # verify
    verify_done.record(forward)
    if fixed:
        draft.wait_event(verify_done)
    with torch.cuda.stream(draft):
        draft_hidden.copy_(verify_logits * 2)  # draft_extend


if __name__ == "__main__":
    main(fixed="--fixed" in sys.argv[1:])
