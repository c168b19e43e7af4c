"""Vector clocks for the happens-before race detector.

A context is the host or one stream; contexts are small integers (``CtxId``), the
host is always 0. A clock is a list of ints indexed by context; a missing entry is 0.
Clocks handed out as snapshots are never mutated afterwards.
"""
from __future__ import annotations

from typing import List

CtxId = int
Epoch = int
Clock = List[int]

HOST: CtxId = 0


def join_into(dst: Clock, src: Clock) -> None:
    """dst := pointwise max(dst, src), growing dst as needed."""
    n = len(src)
    if len(dst) < n:
        dst.extend([0] * (n - len(dst)))
    for i in range(n):
        v = src[i]
        if v > dst[i]:
            dst[i] = v


def get(clock: Clock, ctx: CtxId) -> int:
    return clock[ctx] if ctx < len(clock) else 0
