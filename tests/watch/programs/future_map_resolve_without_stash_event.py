"""The draft stream resolves step N+1's FutureMap rows before forward N's stash is
ordered before it (no wait on the stash event).

Twin (``--fixed``): the draft stream waits on ``stash_done`` before resolving.
"""
import sys

import torch

KINDS = ("stream-stream",)
SANITIZER = True
BUG = None
SELFTEST = "future_map_resolve_without_stash_event"


def main(fixed: bool) -> None:
    forward, draft = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(forward):
        future_map = torch.empty(4, 2, dtype=torch.int64, device="cuda")
    with torch.cuda.stream(draft):
        draft_input = torch.empty(4, 2, dtype=torch.int64, device="cuda")
    stash_done = torch.cuda.Event()
    with torch.cuda.stream(forward):
        future_map.fill_(17)  # stash_next_draft_input
    stash_done.record(forward)
    if fixed:
        draft.wait_event(stash_done)
    with torch.cuda.stream(draft):
        draft_input.copy_(future_map)  # resolve_future_map


if __name__ == "__main__":
    main(fixed="--fixed" in sys.argv[1:])
