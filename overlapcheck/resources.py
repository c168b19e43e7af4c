"""What this machine can hold: sizes from input (a config's pool, a number of requests,
a number of processes) are checked here before anything is allocated, so that an
impossible one is a one-line error instead of an allocator's traceback, a process
that grows until the kernel kills it, or a machine that swaps.

No torch, no numpy: the commands check their input before importing the engine.
"""
from __future__ import annotations

import os
from typing import Optional

GIB = 1 << 30


class TooLarge(ValueError):
    """A size this machine cannot hold; one line naming what asked for it."""


def available_bytes() -> Optional[int]:
    """Memory a new allocation can get now: ``MemAvailable`` of ``/proc/meminfo``, or the
    physical memory where that is not there; None when neither is known."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def size_text(nbytes: float) -> str:
    if nbytes >= 1 << 40:
        return f"{nbytes / (1 << 40):.1f} TiB"
    if nbytes >= GIB:
        return f"{nbytes / GIB:.1f} GiB"
    return f"{nbytes / (1 << 20):.0f} MiB"


def check_fits(nbytes: int, what: str, available: Optional[int] = None) -> None:
    """``TooLarge`` when ``nbytes`` (what ``what`` needs at least) exceeds the memory
    available; nothing when it fits or the machine does not say."""
    have = available_bytes() if available is None else available
    if have is not None and nbytes > have:
        raise TooLarge(f"{what} needs at least {size_text(nbytes)}; this machine has "
                       f"{size_text(have)} available")


def cpus() -> int:
    """CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)
