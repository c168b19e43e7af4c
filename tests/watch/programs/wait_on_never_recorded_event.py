"""The draft stream waits on an event that was never recorded (a no-op in CUDA), then
reads what the forward stream writes.

Twin (``--fixed``): the forward stream records the event before the draft waits.
"""
import sys

import torch

KINDS = ("stream-stream",)
SANITIZER = True
BUG = None
SELFTEST = "wait_on_never_recorded_event"


def main(fixed: bool) -> None:
    forward, draft = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(forward):
        accept_lens = torch.empty(4, dtype=torch.int64, device="cuda")
    with torch.cuda.stream(draft):
        draft_seq_lens = torch.empty(4, dtype=torch.int64, device="cuda")
    accept_done = torch.cuda.Event()
    if not fixed:
        draft.wait_event(accept_done)
    with torch.cuda.stream(forward):
        accept_lens.fill_(3)  # accept
    accept_done.record(forward)
    if fixed:
        draft.wait_event(accept_done)
    with torch.cuda.stream(draft):
        draft_seq_lens.copy_(accept_lens + 16)  # advance_seq_lens


if __name__ == "__main__":
    main(fixed="--fixed" in sys.argv[1:])
