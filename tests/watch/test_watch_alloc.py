"""The CPU shim's model of the CUDA caching allocator, and the reuse verdicts it gives."""
import logging

import pytest
import torch

from overlapcheck.watch import watch
from overlapcheck.watch.shim_alloc import SMALL_SEGMENT, CachingAllocatorModel


def test_a_freed_block_goes_to_the_next_fitting_request_of_its_stream():
    a = CachingAllocatorModel()
    x = a.malloc(16, stream=1)
    y = a.malloc(16, stream=1)
    assert y == x + 512
    a.free(x)
    assert a.malloc(100, stream=2) != x     # pools are per stream
    assert a.malloc(300, stream=1) == x     # rounded to 512: the freed block fits
    a.free(y)
    big = a.malloc(1024, stream=1)
    assert big == y                         # merged with the free tail behind it


def test_split_and_merge_restore_a_whole_segment():
    a = CachingAllocatorModel()
    blocks = [a.malloc(512, stream=0) for _ in range(4)]
    for b in reversed(blocks):
        a.free(b)
    assert a.malloc(SMALL_SEGMENT, stream=0) > blocks[0]  # 2 MiB is a large-pool request
    assert a.malloc(2048, stream=0) == blocks[0]            # the merged small segment


def test_large_requests_have_their_own_pool():
    a = CachingAllocatorModel()
    small = a.malloc(512, stream=0)
    large = a.malloc(4 << 20, stream=0)
    a.free(large)
    assert a.malloc(4 << 20, stream=0) == large
    assert a.malloc(512, stream=0) == small + 512


def _reuse(record: bool, wait: bool):
    schedule, forward = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(schedule):
        idx = torch.arange(2, device="cuda")
    forward.wait_stream(schedule)
    with torch.cuda.stream(forward):
        idx.sum()
    if record:
        idx.record_stream(forward)
    del idx
    if wait:
        schedule.wait_stream(forward)
    with torch.cuda.stream(schedule):
        torch.zeros(2, dtype=torch.int64, device="cuda")  # takes idx's block


@pytest.mark.parametrize("record, wait, racy", [
    (False, False, True), (True, False, False), (False, True, False)],
    ids=["unordered", "record_stream", "wait_stream"])
def test_reuse_verdicts(record, wait, racy):
    logger = logging.getLogger("overlapcheck.watch")
    level, logger.level = logger.level, logging.ERROR
    try:
        with watch(device="cpu", mode="log") as w:
            _reuse(record, wait)
    finally:
        logger.setLevel(level)
    assert [r.kind for r in w.reports] == (["reuse"] if racy else [])
