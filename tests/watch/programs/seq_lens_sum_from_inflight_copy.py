"""With the wait-for-verify sync removed, ``seq_lens_sum`` for the next batch is
summed on the host from the pinned ``seq_lens`` copy still in flight.

Twin (``--fixed``): synchronize the copy stream (wait for verify) before summing.
"""
import sys

import torch

KINDS = ("host-read-before-copy",)
SANITIZER = False
BUG = None
SELFTEST = "seq_lens_sum_from_inflight_copy"


def main(fixed: bool) -> None:
    forward, copy = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(forward):
        seq_lens = torch.empty(4, dtype=torch.int64, device="cuda")
        torch.arange(10, 14, out=seq_lens)  # verify: new sequence lengths
    seq_lens_cpu = torch.empty(4, dtype=torch.int64, pin_memory=True)
    copy.wait_stream(forward)
    with torch.cuda.stream(copy):
        seq_lens_cpu.copy_(seq_lens, non_blocking=True)
    if fixed:
        copy.synchronize()
    seq_lens_sum = int(seq_lens_cpu.sum())  # attention metadata of the next batch
    del seq_lens_sum


if __name__ == "__main__":
    main(fixed="--fixed" in sys.argv[1:])
