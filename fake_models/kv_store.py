"""Indexed KV writes whose result does not depend on the order duplicates land in.

``kv[slots] = new`` with a slot twice keeps the last value on CPU and an unspecified
one on CUDA. A write with ``keep`` passes its masked entries' slots too (a static
shape, no host sync), and a masked entry may share its slot with a kept one: EAGLE's
prefill has no pair for a prompt's first token, so that entry is masked at position
0, which the second token's pair writes in the same call. Here a masked entry carries
the value of the last kept entry with its slot (the slot's current value when none is
kept), so every entry of a slot writes the same value on every backend. Two *kept*
entries of one slot are left as they are: that is a caller's bug, which the sim's
exact access inference reports (``DuplicateWriteError``).
"""
from __future__ import annotations

from typing import Optional

import torch


def kept_sources(n_slots: int, slots: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Per entry, the entry whose value it writes: itself where kept, else the last
    kept entry with the same slot, else -1 (keep the slot's value). ``n_slots``: the
    buffer's rows (``slots`` index them)."""
    n = slots.shape[0]
    idx = torch.arange(n, device=slots.device)
    cand = torch.where(keep, idx, -1)
    last = torch.full((n_slots,), -1, dtype=idx.dtype, device=slots.device)
    last = last.scatter_reduce(0, slots, cand, "amax")
    return torch.where(keep, idx, last[slots])


def store(dst: torch.Tensor, slots: torch.Tensor, new: torch.Tensor,
          src: Optional[torch.Tensor] = None) -> None:
    """``dst[slots] = new`` (``dst`` may be a column slice of a KV buffer); with ``src``
    (``kept_sources``), masked entries write their kept twin's value or the slot's own."""
    if src is not None:
        new = torch.where((src >= 0).unsqueeze(1), new[src.clamp(min=0)], dst[slots])
    dst[slots] = new
