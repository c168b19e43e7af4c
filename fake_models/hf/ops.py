"""Batch-invariant ops of the HF-family decoder, built on ``fake_models.tiny_ops``.

Small weights go through ``tiny_ops.linear`` (elementwise products summed as a fixed
tree). Weights too large for that (real sizes: a 1024 x 151936 lm head) use a
*per-query* matmul of fixed shape ``[1, din] @ [din, dout]`` on a fresh contiguous
copy of the row: the same kernel with the same summation order runs for every query,
whatever the batch, so the bits are still batch invariant (on CPU with one intra-op
thread; on CUDA with cuBLAS' deterministic workspace setting).
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from ..tiny_ops import NEG, context_slots, poly_exp, tree_sum
from ..tiny_ops import linear as tree_linear

__all__ = ["linear", "rms_norm", "rope", "rope_tables", "attend_gqa", "context_slots", "silu"]

TREE_LIMIT = 1 << 18    # weights with more elements take the per-query matmul
EXP = dict(degree=9, squarings=6)


def linear(x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``x @ w (+ b)`` for ``x [..., din]``, ``w [din, dout]``; batch invariant."""
    if w.numel() <= TREE_LIMIT:
        din, p = w.shape[0], 1 << (w.shape[0] - 1).bit_length()
        if p != din:   # pad the operands, not the [.., din, dout] product (same tree)
            x = torch.cat([x, x.new_zeros(x.shape[:-1] + (p - din,))], -1)
            w = torch.cat([w, w.new_zeros((p - din, w.shape[1]))], 0)
        y = tree_linear(x, w)
    else:
        flat = x.reshape(-1, x.shape[-1])
        rows = [torch.mm(flat[i:i + 1].clone(), w) for i in range(flat.shape[0])]
        y = (torch.cat(rows, 0) if rows else flat.new_zeros((0, w.shape[1])))
        y = y.reshape(*x.shape[:-1], w.shape[1])
    return y if b is None else y + b


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """HF RMSNorm over the last dimension (sum as a fixed tree)."""
    return x / torch.sqrt(tree_sum(x * x, -1).unsqueeze(-1) / x.shape[-1] + eps) * w


def silu(x: torch.Tensor) -> torch.Tensor:
    """``x * sigmoid(x)`` from ``poly_exp`` (``exp(-|x|)``), elementwise and exact-path."""
    e = poly_exp(-x.abs(), **EXP)
    return torch.where(x >= 0, x / (1.0 + e), x * e / (1.0 + e))


def rope_tables(max_pos: int, head_dim: int, theta: float, llama3=None):
    """(cos, sin) ``[max_pos, head_dim/2]`` in float64 -> float32, with Llama-3 frequency
    scaling when ``llama3 = (factor, low, high, original_max)``."""
    inv = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    if llama3 is not None:
        factor, low, high, orig = llama3
        wave = 2 * math.pi / inv
        smooth = ((orig / wave) - low) / (high - low)
        mid = (1 - smooth) * inv / factor + smooth * inv
        inv = torch.where(wave > orig / low, inv / factor, torch.where(wave < orig / high, inv, mid))
    ang = torch.arange(max_pos, dtype=torch.float64).unsqueeze(1) * inv
    return torch.cos(ang).float(), torch.sin(ang).float()


def rope(x: torch.Tensor, pos: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """HF rotate-half RoPE of ``x [q, heads, hd]`` at positions ``pos [q]``."""
    h = x.shape[-1] // 2
    c, s = cos[pos].unsqueeze(1), sin[pos].unsqueeze(1)
    x1, x2 = x[..., :h], x[..., h:]
    return torch.cat([x1 * c - x2 * s, x1 * s + x2 * c], -1)


def attend_gqa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Grouped-query softmax attention, one query per row: ``q [n, H, hd]``,
    ``k, v [n, W, KVH, hd]``, ``mask [n, W]``; returns ``[n, H, hd]``. Query head ``h``
    reads KV head ``h // (H / KVH)``; masked keys and values never reach the result."""
    n, heads, hd = q.shape
    group = heads // k.shape[2]
    m3 = mask[:, :, None, None]
    k = torch.where(m3, k, 0.0).repeat_interleave(group, 2)          # [n, W, H, hd]
    v = torch.where(m3, v, 0.0).repeat_interleave(group, 2)
    s = tree_sum(q.unsqueeze(1) * k, -1) / math.sqrt(hd)              # [n, W, H]
    s = torch.where(mask.unsqueeze(-1), s, NEG)
    e = torch.where(mask.unsqueeze(-1), poly_exp(s - s.max(1, keepdim=True).values, **EXP), 0.0)
    p = e / tree_sum(e, 1).unsqueeze(1)
    return tree_sum(p.unsqueeze(-1) * v, 1)
