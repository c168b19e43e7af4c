"""CPU equivalents of the Triton kernels that SGLang's *scheduler-side* spec-decode
path launches (table writes during decode preparation), swapped in for a session.

Without spec decode the scheduler needs no kernel on CPU. With it, preparing a decode
writes request->token cells through Triton kernels that have no CPU build (SGLang's own
CPU engine routes them to ``sgl_kernel``'s CPU ops, which are not on PyPI for this
torch). Each replacement below is written from the kernel's source and does exactly
what the kernel does, with torch ops on the CPU tensors; ``cpu_kernels()`` installs them
in every SGLang module that imported the kernel wrapper, and restores the originals.
"""
from __future__ import annotations

import contextlib
import functools
import sys
from typing import Iterator, List, Tuple

import torch


def assign_req_to_token_pool(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                             start_offset: torch.Tensor, end_offset: torch.Tensor,
                             out_cache_loc: torch.Tensor, batch_size: int) -> None:
    """``allocation.assign_req_to_token_pool``: request ``i``'s cells
    ``[start_i, end_i)`` of row ``req_pool_indices[i]`` get the next ``end_i -
    start_i`` entries of ``out_cache_loc`` (requests packed in batch order). One
    device kernel: it reads its arguments on the device, never on the host."""
    from overlapcheck.watch.kernel import device_kernel
    from .twins import _flat, _np
    reads = (req_pool_indices, start_offset, end_offset, out_cache_loc)
    with device_kernel("assign_req_to_token_pool", reads, (req_to_token,)):
        rows, starts, ends = _np(req_pool_indices), _np(start_offset), _np(end_offset)
        table, locs = _np(req_to_token), _flat(out_cache_loc)
        off = 0
        for i in range(batch_size):
            a, b = int(starts[i]), int(ends[i])
            n = b - a
            if n > 0:
                table[int(rows[i]), a:b] = locs[off:off + n]
            off += max(n, 0)


# (module, attribute) -> replacement
REPLACEMENTS = {
    "assign_req_to_token_pool_func": assign_req_to_token_pool,
}


@functools.lru_cache(maxsize=1)
def _sites(modules: int) -> Tuple[Tuple[object, str], ...]:
    """Every SGLang module that imported a kernel wrapper by name; ``modules`` is
    ``len(sys.modules)``, so the scan reruns only when modules were imported since."""
    return tuple((mod, attr) for name, mod in list(sys.modules.items())
                 if name.startswith("sglang.") and mod is not None
                 for attr in REPLACEMENTS if attr in getattr(mod, "__dict__", {}))


@contextlib.contextmanager
def cpu_kernels() -> Iterator[None]:
    saved: List[Tuple[object, str, object]] = []
    for mod, attr in _sites(len(sys.modules)):
        saved.append((mod, attr, mod.__dict__[attr]))
        setattr(mod, attr, REPLACEMENTS[attr])
    try:
        yield
    finally:
        for mod, attr, orig in reversed(saved):
            setattr(mod, attr, orig)
