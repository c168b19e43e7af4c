"""Buffers, regions and poison values shared by both device backends."""
from __future__ import annotations

from typing import FrozenSet, Iterable, Optional

import torch

DEVICE = "device"
PINNED = "pinned"
PAGEABLE = "pageable"

_INT_POISON = {
    torch.int64: -0x5A5A5A5A5A5A5A5B,
    torch.int32: -0x5A5A5A5B,
    torch.int16: -0x5A5B,
    torch.int8: -0x5B,
    torch.uint8: 0xA5,
}


def poison_value(dtype: torch.dtype):
    """The value fresh device and pinned memory is filled with, so that a read of
    never-written data shows."""
    if dtype.is_floating_point:
        return float("nan")
    if dtype == torch.bool:
        return True
    return _INT_POISON.get(dtype, -1)


def is_poison(t: torch.Tensor) -> torch.Tensor:
    """Elementwise: does ``t`` still hold the poison value?"""
    if t.dtype.is_floating_point:
        return torch.isnan(t)
    return t == poison_value(t.dtype)


class Buffer:
    """A tracked allocation. ``t`` is the tensor (CPU tensor on the sim, a CUDA or
    pinned tensor on cuda); ``space`` is device, pinned or pageable. Closures read and
    write ``buf.t``; the host goes through the runtime's accessors."""

    __slots__ = ("name", "t", "space", "mem", "serial", "stream", "pledged", "freed", "ptr")

    def __init__(self, name: str, t: torch.Tensor, space: str, mem: object, serial: int,
                 stream=None):
        self.name = name
        self.t = t
        self.space = space
        self.mem = mem
        self.serial = serial
        self.stream = stream
        self.pledged: list = []
        self.freed = False
        self.ptr = None     # its storage's address, set by the runtime that registers it

    @property
    def owner(self) -> str:
        return f"{self.name}#{self.serial}"

    def rows(self, rows: Iterable[int]) -> "Region":
        if type(rows) is not frozenset:    # a frozenset is taken as it is (it holds ints)
            rows = frozenset(map(int, rows))
        return Region(self, rows)

    def __repr__(self) -> str:
        return f"Buffer({self.owner}, {self.space}, {tuple(self.t.shape) if self.t is not None else None})"


class Region:
    """A buffer narrowed to rows of its first dimension (``rows=None``: all of it).
    Immutable by contract (made once per declared access, so kept light)."""

    __slots__ = ("buffer", "rows")

    def __init__(self, buffer: Buffer, rows: Optional[FrozenSet[int]] = None):
        self.buffer, self.rows = buffer, rows

    def __eq__(self, other) -> bool:
        return (isinstance(other, Region) and self.buffer is other.buffer
                and self.rows == other.rows)

    def __hash__(self) -> int:
        return hash((id(self.buffer), self.rows))

    def __repr__(self) -> str:
        return f"Region(buffer={self.buffer!r}, rows={self.rows!r})"


def as_region(x) -> Region:
    if isinstance(x, Region):
        return x
    if isinstance(x, Buffer):
        return Region(x, None)
    raise TypeError(f"expected a Buffer or a Region, got {type(x).__name__}")
