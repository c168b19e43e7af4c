"""vLLM #25279: reused CPU tensors (the sampling metadata) are modified for the next
step while the previous step's non-blocking copies from them to the GPU may still run.

Under async scheduling, ``_update_states`` rewrites persistent pinned CPU tensors and
copies them to the GPU asynchronously each step. The fix widened the synchronized
section: before touching the reused CPU tensors, the host synchronizes
``prepare_inputs_event``, recorded after the previous step's copies.

Twin (``--fixed``): ``prepare_inputs_event.synchronize()`` before the host writes.
"""
import sys

import torch

KINDS = ("host-write-during-copy",)
SANITIZER = False
BUG = "vLLM #25279"
SELFTEST = None


def main(fixed: bool) -> None:
    temperature_cpu = torch.empty(4, pin_memory=True)
    top_k_cpu = torch.empty(4, dtype=torch.int32, pin_memory=True)
    temperature = torch.empty(4, device="cuda")
    top_k = torch.empty(4, dtype=torch.int32, device="cuda")
    logits = torch.empty(4, 16, device="cuda")
    logits.fill_(1.0)
    prepare_inputs_event = torch.cuda.Event()
    for step in range(3):
        if fixed:
            prepare_inputs_event.synchronize()  # a no-op before the first record
        # _update_states: the persistent CPU tensors get this step's sampling params
        temperature_cpu.fill_(0.5 + step)
        top_k_cpu[:] = torch.tensor([4, 8, 4, 8], dtype=torch.int32)
        temperature.copy_(temperature_cpu, non_blocking=True)
        top_k.copy_(top_k_cpu, non_blocking=True)
        prepare_inputs_event.record()
        # the step's GPU work uses them
        probs = (logits / temperature[:, None]).softmax(-1)
        kth = probs.topk(8, dim=-1).values.gather(1, (top_k[:, None] - 1).long())
        del probs, kth


if __name__ == "__main__":
    main(fixed="--fixed" in sys.argv[1:])
