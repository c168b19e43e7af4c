"""The schedule stream writes the next batch's hidden states, then its logits, each
while the forward stream may still be gathering the accepted entries from them:
``hidden[mask]`` and ``masked_select`` make the host wait only for the number of
selected entries; the kernels that read ``hidden`` and ``logits`` and write the
selection are queued after that wait, and nothing waits for them.

Twin (``--fixed``): the schedule stream waits for the forward stream before each write.
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
        hidden = torch.ones(4, 8, device="cuda")
        logits = torch.zeros(4, device="cuda")
        accepted = torch.tensor([True, False, True, True], device="cuda")
    forward.wait_stream(schedule)
    with torch.cuda.stream(forward):
        draft_input = hidden[accepted]  # the host waits for the count only
    if fixed:
        schedule.wait_stream(forward)
    with torch.cuda.stream(schedule):
        hidden.fill_(2.0)  # the next batch's hidden states
    with torch.cuda.stream(forward):
        accepted_logits = torch.masked_select(logits, accepted)  # the same
    if fixed:
        schedule.wait_stream(forward)
    with torch.cuda.stream(schedule):
        logits.fill_(1.0)  # the next batch's logits
    del draft_input, accepted_logits


if __name__ == "__main__":
    main(fixed="--fixed" in sys.argv[1:])
