"""Batch-invariant building blocks for the tiny transformer.

Bitwise batch invariance is a property of *how* each output element is computed, not
of the model: a query's result must not depend on how many other queries share the
tensor. BLAS matmuls and library reductions pick their summation order (and, on CPU,
vectorized vs scalar tails for transcendental functions) from the tensor shapes, so
they are avoided. Everything here uses only

* elementwise ``+ - * /``, ``sqrt``, ``max``, comparisons and ``where`` (IEEE
  correctly rounded, the same value on every code path and on every device), and
* sums as fixed binary trees over a dimension whose size never depends on the batch
  (the model width, or the request->token row width): ``tree_sum``.

``exp`` is a fixed polynomial with range reduction made of the same operations, so a
query alone, in a batch of eight, or split across prefill chunks gets the same bits.
Tensors are created on the device of the inputs.
"""
from __future__ import annotations

import torch

EXP_FLOOR = -20.0
NEG = -1.0e30


def tree_sum(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Sum over ``dim`` as a fixed binary tree (zero-padded to a power of two)."""
    dim = dim % x.dim()
    n = x.shape[dim]
    p = 1
    while p < n:
        p *= 2
    if p != n:
        shape = list(x.shape)
        shape[dim] = p - n
        x = torch.cat([x, x.new_zeros(shape)], dim)
    while p > 1:
        p //= 2
        x = x.narrow(dim, 0, p) + x.narrow(dim, p, p)
    return x.squeeze(dim)


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x @ w`` for ``x [..., din]`` and ``w [din, dout]``, summed as a tree over din."""
    return tree_sum(x.unsqueeze(-1) * w, -2)


def poly_exp(x: torch.Tensor, degree: int = 6, squarings: int = 5) -> torch.Tensor:
    """``exp(x)`` for ``x <= 0``: clamp, divide by ``2**squarings``, Taylor polynomial of
    ``degree`` (Horner), square ``squarings`` times. The defaults (relative error about
    2e-4) are the tiny model's; ``degree=9, squarings=6`` is accurate to about 1e-5."""
    y = x.clamp(min=EXP_FLOOR) / float(2 ** squarings)
    p = 1.0 + y / float(degree)
    for k in range(degree - 1, 0, -1):
        p = 1.0 + (y / float(k)) * p
    for _ in range(squarings):
        p = p * p
    return p


def rms_norm(x: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    return x / torch.sqrt(tree_sum(x * x, -1).unsqueeze(-1) / x.shape[-1] + eps)


def rope(x: torch.Tensor, pos: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding of ``x [q, d]`` at positions ``pos [q]`` from
    precomputed tables ``cos, sin [max_pos, d/2]``."""
    h = x.shape[-1] // 2
    c, s = cos[pos], sin[pos]
    x1, x2 = x[..., :h], x[..., h:]
    return torch.cat([x1 * c - x2 * s, x1 * s + x2 * c], -1)


def rope_tables(max_pos: int, d: int, base: float = 10000.0):
    """(cos, sin) tables, computed in float64 on the CPU once, stored as float32."""
    inv = base ** (-torch.arange(0, d // 2, dtype=torch.float64) * 2.0 / d)
    ang = torch.arange(max_pos, dtype=torch.float64).unsqueeze(1) * inv
    return torch.cos(ang).float(), torch.sin(ang).float()


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Softmax attention of one query per row: ``q [n, d]``, ``k, v [n, W, d]``,
    ``mask [n, W]`` (True: attend). Masked keys and values never reach the result,
    even when they hold NaN poison."""
    d = q.shape[-1]
    s = tree_sum(q.unsqueeze(1) * torch.where(mask.unsqueeze(-1), k, 0.0), -1) / (d ** 0.5)
    s = torch.where(mask, s, NEG)
    m = s.max(-1, keepdim=True).values
    e = torch.where(mask, poly_exp(s - m), 0.0)
    p = e / tree_sum(e, -1).unsqueeze(-1)
    return tree_sum(p.unsqueeze(-1) * torch.where(mask.unsqueeze(-1), v, 0.0), 1)


def context_slots(table: torch.Tensor, rows: torch.Tensor, last: torch.Tensor):
    """Slots of positions ``0..last`` (inclusive) of each query's request row, and the
    mask; masked cells read the padding slot 0 (their table cells may be poison)."""
    width = table.shape[1]
    pos = torch.arange(width, device=table.device)
    mask = pos.unsqueeze(0) <= last.unsqueeze(1)
    return torch.where(mask, table[rows], 0), mask
