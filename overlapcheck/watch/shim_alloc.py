"""A model of PyTorch's CUDA caching allocator, for the CPU shim.

On a GPU, which freed block a new tensor gets decides which reuse races exist: a
block freed on stream A goes back to A's pool, and A's next allocation of a fitting
size takes it at once unless ``record_stream`` pledged other streams. The shim has
no device memory, so it replays the allocator's policy on made-up addresses, and
the detector sees the same blocks change owner as on a GPU:

* sizes round up to 512 bytes; requests up to 1 MiB come from the small pool (2 MiB
  segments), larger ones from the large pool (20 MiB segments below 10 MiB, else
  rounded to 2 MiB);
* pools are per stream; a request takes the smallest free block that fits, the
  lowest address among equals, and splits it when the rest is worth keeping (at least
  512 bytes in the small pool, more than 1 MiB in the large one);
* a freed block merges with free neighbours of its segment.

A freed block pledged to other streams is reusable at once here (on a GPU it waits
until their work is done, or the request takes another block); the detector orders
the pledged work before the block's next owner either way, so the verdict is the
same. Kernels' internal workspaces, invisible to the shim, are not modelled.
"""
from __future__ import annotations

import bisect
from typing import Dict, List, Optional, Tuple

ROUND = 512
SMALL = 1 << 20
SMALL_SEGMENT = 2 << 20
LARGE_SEGMENT = 20 << 20
MIN_LARGE_ALLOC = 10 << 20
ROUND_LARGE = 2 << 20
_BASE = 0x7F0000000000


def round_size(n: int) -> int:
    return ROUND if n < ROUND else ROUND * ((n + ROUND - 1) // ROUND)


def segment_size(n: int) -> int:
    if n <= SMALL:
        return SMALL_SEGMENT
    if n < MIN_LARGE_ALLOC:
        return LARGE_SEGMENT
    return ROUND_LARGE * ((n + ROUND_LARGE - 1) // ROUND_LARGE)


class _Block:
    __slots__ = ("addr", "size", "pool", "free", "prev", "next")

    def __init__(self, addr: int, size: int, pool: Tuple, free: bool):
        self.addr, self.size, self.pool, self.free = addr, size, pool, free
        self.prev: Optional[_Block] = None
        self.next: Optional[_Block] = None


class CachingAllocatorModel:
    """``malloc(nbytes, stream) -> address`` and ``free(address)``."""

    def __init__(self) -> None:
        self._pools: Dict[Tuple, List[Tuple[int, int, _Block]]] = {}  # sorted (size, addr)
        self._live: Dict[int, _Block] = {}
        self._top = _BASE

    def malloc(self, nbytes: int, stream: int) -> int:
        size = round_size(max(nbytes, 1))
        pool = (stream, size <= SMALL)
        free = self._pools.setdefault(pool, [])
        i = bisect.bisect_left(free, (size, -1))
        if i < len(free):
            block = free.pop(i)[2]
        else:
            seg = segment_size(size)
            block = _Block(self._top, seg, pool, True)
            self._top += seg + ROUND_LARGE  # segments never touch: no merging across them
        rest = block.size - size
        if rest >= ROUND if pool[1] else rest > SMALL:
            tail = _Block(block.addr + size, rest, pool, True)
            tail.prev, tail.next = block, block.next
            if block.next is not None:
                block.next.prev = tail
            block.next, block.size = tail, size
            bisect.insort(free, (tail.size, tail.addr, tail))
        block.free = False
        self._live[block.addr] = block
        return block.addr

    def free(self, addr: int) -> None:
        block = self._live.pop(addr)
        free = self._pools[block.pool]
        block.free = True
        for other in (block.prev, block.next):
            if other is not None and other.free:
                free.remove((other.size, other.addr, other))
                first, second = (other, block) if other is block.prev else (block, other)
                first.size += second.size
                first.next = second.next
                if second.next is not None:
                    second.next.prev = first
                block = first
        bisect.insort(free, (block.size, block.addr, block))
