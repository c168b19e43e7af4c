"""vLLM #54269: the V2 model runner rewrites reused pinned input buffers (``seq_lens``,
``query_start_loc``) for the next step, real or dummy, while the previous step's
non-blocking host-to-device copies from them may not have run yet.

The PR ports to the V2 runner the ``prepare_inputs_event`` protocol of the V1 runner
(which vLLM extended to V1's dummy runs too): every step, dummy ones included, records
the event after its input copies, and the next step synchronizes it before writing
the pinned buffers.

Twin (``--fixed``): the protocol, in real and dummy steps alike.
"""
import sys

import torch

KINDS = ("host-write-during-copy",)
SANITIZER = False
BUG = "vLLM #54269"
SELFTEST = None
MAX_REQS = 4


def prepare_inputs(seq_lens_cpu, query_start_loc_cpu, seq_lens, query_start_loc,
                   lens) -> None:
    n = len(lens)
    seq_lens_cpu[:n] = torch.tensor(lens, dtype=torch.int32)
    query_start_loc_cpu[0] = 0
    query_start_loc_cpu[1:n + 1] = torch.tensor(lens, dtype=torch.int32).cumsum(0)
    seq_lens.copy_(seq_lens_cpu, non_blocking=True)
    query_start_loc.copy_(query_start_loc_cpu, non_blocking=True)


def main(fixed: bool) -> None:
    seq_lens_cpu = torch.zeros(MAX_REQS, dtype=torch.int32, pin_memory=True)
    query_start_loc_cpu = torch.zeros(MAX_REQS + 1, dtype=torch.int32, pin_memory=True)
    seq_lens = torch.empty(MAX_REQS, dtype=torch.int32, device="cuda")
    query_start_loc = torch.empty(MAX_REQS + 1, dtype=torch.int32, device="cuda")
    prepare_inputs_event = torch.cuda.Event()
    steps = [[3, 5], [1], [4, 4, 2], [1]]  # real steps and dummy (idle) steps of one token
    for lens in steps:
        if fixed:
            prepare_inputs_event.synchronize()
        prepare_inputs(seq_lens_cpu, query_start_loc_cpu, seq_lens, query_start_loc, lens)
        if fixed:
            prepare_inputs_event.record()
        attn = (seq_lens[:len(lens)] + query_start_loc[1:len(lens) + 1]).float().mean()
        del attn


if __name__ == "__main__":
    main(fixed="--fixed" in sys.argv[1:])
