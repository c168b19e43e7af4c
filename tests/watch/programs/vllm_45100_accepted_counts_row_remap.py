"""vLLM #45100: accepted-token counts are copied device-to-host with ``non_blocking=True``
into a pinned buffer laid out in the batch's row order, and the next step's batch
update moves rows of that same buffer on the host (a finished request's slot is
refilled from the last row) before waiting for the copy.

Which value lands in which row then depends on whether the copy finished before or
after the row moves: a request can get another request's count. The remedy, as the
public discussions of this mechanism put it (vLLM #51571, #53919), is to wait for the
copy's event before the first row move.

Twin (``--fixed``): the copy's event is synchronized before the rows are moved.
"""
import sys

import torch

KINDS = ("host-read-before-copy", "host-stream")
SANITIZER = False
BUG = "vLLM #45100"
SELFTEST = None


def main(fixed: bool) -> None:
    num_accepted = torch.empty(4, dtype=torch.int32, device="cuda")
    num_accepted_cpu = torch.empty(4, dtype=torch.int32, pin_memory=True)
    accepted_event = torch.cuda.Event()
    for step in range(3):
        # step N: rejection sampling writes the counts; async copy into the batch rows
        num_accepted.copy_(torch.arange(1, 5, dtype=torch.int32, device="cuda") + step)
        num_accepted_cpu.copy_(num_accepted, non_blocking=True)
        accepted_event.record()
        # step N+1's batch update: request 1 finished; condense moves row 3 into row 1
        if fixed:
            accepted_event.synchronize()
        num_accepted_cpu[1] = num_accepted_cpu[3]
        # _prepare_inputs synchronizes only here, after the rows have moved
        accepted_event.synchronize()
        counts = num_accepted_cpu.tolist()
        assert len(counts) == 4


if __name__ == "__main__":
    main(fixed="--fixed" in sys.argv[1:])
