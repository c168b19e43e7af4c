"""The schedule stream clears the acceptance mask while the forward stream's
``nonzero`` may still be reading it: ``nonzero`` makes the host wait only for the count
of accepted drafts; the kernel that re-reads the mask and writes the positions is
queued after that wait, and nothing waits for it.

Twin (``--fixed``): the schedule stream waits for the forward stream before it clears
the mask.
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
        draft_tokens = torch.tensor([5, 7, 9, 11], device="cuda")
        target_tokens = torch.tensor([5, 7, 8, 11], device="cuda")
        accepted = torch.empty(4, dtype=torch.bool, device="cuda")
    forward.wait_stream(schedule)
    with torch.cuda.stream(forward):
        torch.eq(draft_tokens, target_tokens, out=accepted)  # verify
        accepted_pos = accepted.nonzero()  # the host waits for the count only
    if fixed:
        schedule.wait_stream(forward)
    with torch.cuda.stream(schedule):
        accepted.fill_(False)  # cleared for the next step
    del accepted_pos


if __name__ == "__main__":
    main(fixed="--fixed" in sys.argv[1:])
