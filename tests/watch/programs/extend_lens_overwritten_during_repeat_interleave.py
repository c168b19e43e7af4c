"""The schedule stream writes the next batch's extend lengths while the forward
stream's ``repeat_interleave`` may still be reading them: without ``output_size`` it
makes the host wait for the total length, then expands the lengths into per-token
request indices with a kernel queued after that wait, which nothing waits for.

Twin (``--fixed``): the schedule stream waits for the forward stream before writing
the lengths.
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
        req_pool_indices = torch.tensor([4, 1, 6], device="cuda")
        extend_lens = torch.tensor([2, 3, 1], device="cuda")
    forward.wait_stream(schedule)
    with torch.cuda.stream(forward):
        req_of_token = torch.repeat_interleave(req_pool_indices, extend_lens)
    if fixed:
        schedule.wait_stream(forward)
    with torch.cuda.stream(schedule):
        extend_lens.fill_(1)  # the next batch decodes one token each
    del req_of_token


if __name__ == "__main__":
    main(fixed="--fixed" in sys.argv[1:])
