"""vLLM #36013: the pinned ``num_accepted_tokens`` buffer is read on the host before its
non-blocking device-to-host copy has landed.

After each model step the accepted-token counts are copied from the GPU into pinned
host memory with ``non_blocking=True``; the next step builds its attention metadata
from the host copy (a NumPy view). Under async scheduling nothing synchronizes in
between, so the host can read the previous contents. The PR's fix records a CUDA event
after the copy and synchronizes it before the read.

Twin (``--fixed``): the event is synchronized before the host reads the counts.
"""
import sys

import torch

KINDS = ("host-read-before-copy",)
SANITIZER = False
BUG = "vLLM #36013"
SELFTEST = None


def main(fixed: bool) -> None:
    num_accepted_tokens = torch.empty(4, dtype=torch.int32, device="cuda")
    num_accepted_tokens_cpu = torch.empty(4, dtype=torch.int32, pin_memory=True)
    num_accepted_tokens_event = torch.cuda.Event()
    for step in range(3):
        if step > 0:
            # _build_attention_metadata of this step reads the previous step's counts
            if fixed:
                num_accepted_tokens_event.synchronize()
            counts = num_accepted_tokens_cpu.numpy()[:4]
            assert counts.sum() >= 0      # the metadata build reads the counts
        # the model step: rejection sampling writes the accepted counts on the GPU
        num_accepted_tokens.fill_(step + 1)
        # _update_states_after_model_execute: non-blocking copy, no sync (async scheduling)
        num_accepted_tokens_cpu.copy_(num_accepted_tokens, non_blocking=True)
        num_accepted_tokens_event.record()


if __name__ == "__main__":
    main(fixed="--fixed" in sys.argv[1:])
