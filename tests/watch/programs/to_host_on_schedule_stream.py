"""Accept lengths are read back with ``.tolist()`` in the schedule stream's order
while the forward stream still writes them.

Twin (``--fixed``): the blocking read-back is issued in the forward stream's order.
"""
import sys

import torch

KINDS = ("stream-stream",)
SANITIZER = True
BUG = None
SELFTEST = "to_host_on_schedule_stream"


def main(fixed: bool) -> None:
    schedule, forward = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(forward):
        accept_lens = torch.empty(4, dtype=torch.int64, device="cuda")
        accept_lens.fill_(2)  # accept
    with torch.cuda.stream(forward if fixed else schedule):
        lens = accept_lens.tolist()
    assert len(lens) == 4


if __name__ == "__main__":
    main(fixed="--fixed" in sys.argv[1:])
