"""Which kernels the HF-family decoder runs on a device (docs/design.md §4.10).

On a CUDA device with Triton installed: ``triton_ops`` (bf16 matmuls, fused attention
over the paged KV, every reduction in a fixed order per row: bitwise batch invariant,
like a real engine's batch-invariant mode). Everywhere else: ``ops``, the exact path
(float64 grids and fixed trees), whose results are the same bits on every device.
Both modules offer ``prepare``, ``linear``, ``rms_norm``, ``silu``, ``rope``,
``rope_tables``, ``attend`` and ``context_slots``.
"""
from __future__ import annotations

import functools
import importlib.util

import torch

from . import ops


@functools.lru_cache(maxsize=None)
def _triton():
    if importlib.util.find_spec("triton") is None:
        return None
    try:
        from . import triton_ops
    except Exception:   # noqa: BLE001 - a Triton that cannot load leaves the exact path
        return None
    return triton_ops


def for_device(device):
    """The kernel module for ``device``."""
    if torch.device(device).type == "cuda":
        fast = _triton()
        if fast is not None:
            return fast
    return ops


def exact_on(device) -> bool:
    """Whether ``device`` runs the exact path (the same bits as the CPU)."""
    return for_device(device) is ops


def set_pdl(on) -> bool:
    """Programmatic dependent launch of the Triton kernels (``triton_ops.pdl``): on
    (True), off (False) or by the card (None); whether it is on now (False without
    Triton)."""
    fast = _triton()
    if fast is None:
        return False
    fast.set_pdl(on)
    return fast.pdl()
