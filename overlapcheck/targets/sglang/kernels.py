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
    start_i`` entries of ``out_cache_loc`` (requests packed in batch order)."""
    rows = req_pool_indices[:batch_size].tolist()
    starts = start_offset[:batch_size].tolist()
    ends = end_offset[:batch_size].tolist()
    off = 0
    for row, a, b in zip(rows, starts, ends):
        n = int(b) - int(a)
        if n > 0:
            req_to_token[int(row), int(a):int(b)] = out_cache_loc[off:off + n].to(req_to_token.dtype)
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
