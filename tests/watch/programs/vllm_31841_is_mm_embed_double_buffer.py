"""vLLM #31841: with async scheduling, a multimodal model's ``is_mm_embed`` CPU buffer is
rewritten for the current step while the previous step's non-blocking copy to the GPU
may still read it (sporadic engine crashes under load).

The host prepares step N+1 before it waits for step N's output, so the only
synchronization with step N's copy comes one step later. The fix double-buffers
``is_mm_embed``: step N+1 writes the other buffer, and by the time a buffer is reused
(step N+2) the host has waited for step N's output, which follows its copy.

Twin (``--fixed``): two alternating buffers.
"""
import sys

import torch

KINDS = ("host-write-during-copy",)
SANITIZER = False
BUG = "vLLM #31841"
SELFTEST = None
TOKENS = 8


def main(fixed: bool) -> None:
    buffers = [torch.empty(TOKENS, dtype=torch.bool, pin_memory=True)
               for _ in range(2 if fixed else 1)]
    is_mm_embed = torch.empty(TOKENS, dtype=torch.bool, device="cuda")
    text_embeds = torch.zeros(TOKENS, 4, device="cuda")
    mm_embeds = torch.ones(TOKENS, 4, device="cuda")
    prev = None
    for step in range(4):
        buf = buffers[step % len(buffers)]
        buf.fill_(False)  # _gather_mm_embeddings: which positions take image embeddings
        buf[step % TOKENS] = True
        is_mm_embed.copy_(buf, non_blocking=True)
        hidden = torch.where(is_mm_embed[:, None], mm_embeds, text_embeds)
        sampled = hidden.sum(-1).to("cpu", non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        if prev is not None:  # async scheduling: step N's output after N+1 is launched
            prev_done, prev_sampled = prev
            prev_done.synchronize()
            prev_sampled.tolist()
        prev = (done, sampled)


if __name__ == "__main__":
    main(fixed="--fixed" in sys.argv[1:])
