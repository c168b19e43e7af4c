"""Batch-invariant ops of the HF-family decoder, built on ``fake_models.tiny_ops``.

Small weights go through ``tiny_ops.linear`` (elementwise products summed as a fixed
tree). Weights too large for that (real sizes: a 1024 x 151936 lm head) are prepared
once as an ``ExactWeight`` (``prepare``): integers on a power-of-two grid per output
column, in float64. A query row is put on its own power-of-two grid (from its largest
magnitude) and the product is one float64 matmul whose every partial sum is an integer
below 2**52, so it is *exact*: no summation order, split or kernel choice can change a
bit, on any device and in any batch. Each operand keeps about 20 significant bits (a
relative error of about 1e-6 of the row's, or column's, largest value).
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from ..oracle_rule import mix
from ..tiny_ops import NEG, context_slots, poly_exp, tree_sum
from ..tiny_ops import linear as tree_linear

__all__ = ["linear", "gated", "norm_gated", "attention_inputs", "query", "prepare",
           "ExactWeight", "rms_norm", "rope", "rope_tables", "attend_gqa", "sample", "attend", "context_slots", "silu", "heads", "kv_rows", "layer_weights"]

TREE_LIMIT = 1 << 18    # weights with more elements take the per-query matmul
EXP = dict(degree=9, squarings=6)


class ExactWeight:
    """``w [din, dout]`` as ``q * scale``: ``q`` integer-valued float64 with at most
    ``wbits`` bits, ``scale [1, dout]`` a power of two per column; ``xbits``: the bits a
    query row keeps, so that ``din * 2**(xbits + wbits) <= 2**52``."""

    def __init__(self, w: torch.Tensor):
        din = w.shape[0]
        budget = 52 - (din - 1).bit_length()
        self.xbits = budget // 2
        wbits = budget - self.xbits
        self.scale = _pow2_grid(w.abs().amax(0, keepdim=True).double(), wbits)
        self.q = torch.round(w.double() / self.scale)
        self.shape = tuple(w.shape)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.shape[0]).double()
        s = _pow2_grid(flat.abs().amax(-1, keepdim=True), self.xbits)
        y = (torch.round(flat / s) @ self.q) * s * self.scale
        return y.to(x.dtype).reshape(*x.shape[:-1], self.shape[1])


def _pow2_grid(m: torch.Tensor, bits: int) -> torch.Tensor:
    """The power of two ``2**(e - bits)`` where ``m < 2**e``: values up to ``m`` divided by
    it are below ``2**bits``."""
    _, e = torch.frexp(m)
    return torch.ldexp(torch.ones_like(m), e - bits)


def prepare(w: Optional[torch.Tensor]):
    """A weight as ``linear`` takes it: itself when small (the tree), else ``ExactWeight``."""
    if w is None or w.numel() <= TREE_LIMIT:
        return w
    return ExactWeight(w)


def layer_weights(L: dict) -> dict:
    """A layer's prepared weights as this path reads them (nothing added here)."""
    return L


def linear(x: torch.Tensor, w, b: Optional[torch.Tensor] = None,
           residual: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``(residual +) x @ w (+ b)`` for ``x [..., din]``, ``w [din, dout]`` (or its
    ``ExactWeight``); batch invariant."""
    if isinstance(w, ExactWeight):
        y = w(x)
    else:
        din, p = w.shape[0], 1 << (w.shape[0] - 1).bit_length()
        if p != din:   # pad the operands, not the [.., din, dout] product (same tree)
            x = torch.cat([x, x.new_zeros(x.shape[:-1] + (p - din,))], -1)
            w = torch.cat([w, w.new_zeros((p - din, w.shape[1]))], 0)
        y = tree_linear(x, w)
    y = y if b is None else y + b
    return y if residual is None else residual + y


def gated(x: torch.Tensor, wg, wu) -> torch.Tensor:
    """The gated MLP's input to its down projection: ``silu(x @ wg) * (x @ wu)``."""
    return silu(linear(x, wg)) * linear(x, wu)


def norm_gated(h: torch.Tensor, ln: torch.Tensor, eps: float, wg, wu) -> torch.Tensor:
    """``gated`` of ``h``'s RMS-normed rows (one kernel on the GPU path)."""
    return gated(rms_norm(h, ln, eps), wg, wu)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """HF RMSNorm over the last dimension (sum as a fixed tree)."""
    return x / torch.sqrt(tree_sum(x * x, -1).unsqueeze(-1) / x.shape[-1] + eps) * w


def silu(x: torch.Tensor) -> torch.Tensor:
    """``x * sigmoid(x)`` from ``poly_exp`` (``exp(-|x|)``), elementwise and exact-path."""
    e = poly_exp(-x.abs(), **EXP)
    return torch.where(x >= 0, x / (1.0 + e), x * e / (1.0 + e))


def sample(logits: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor,
           seeded: torch.Tensor, vocab: int, percent: int, modulus: int) -> torch.Tensor:
    """Greedy argmax; where ``seeded``, another token ``percent``% of the time (a pure
    function of seed, position and the greedy token: ``fake_models.oracle_rule.mix``)."""
    greedy = logits.argmax(-1)
    u = mix(seeds % modulus, positions + 1)
    other = (greedy + 1 + (u >> 7) % (vocab - 1)) % vocab
    return torch.where(seeded & (u % 100 < percent), other, greedy)


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


def attend(q: torch.Tensor, kv: torch.Tensor, cols, slots: torch.Tensor, mask: torch.Tensor,
           kv_heads: int) -> torch.Tensor:
    """``attend_gqa`` of ``q [n, H, hd]`` over the K columns ``cols[0]:cols[1]`` and V
    columns ``cols[1]:cols[2]`` of ``kv``'s rows ``slots [n, W]``."""
    n, width = slots.shape
    shape = (n, width, kv_heads, q.shape[-1])
    return attend_gqa(q, kv[slots, cols[0]:cols[1]].reshape(shape),
                      kv[slots, cols[1]:cols[2]].reshape(shape), mask)


def heads(x: torch.Tensor, w, b, norm, n_heads: int, head_dim: int, eps: float,
          pos: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Projected heads ``[q, n_heads, head_dim]`` of ``x``: the linear, the per-head
    RMSNorm where ``norm`` is given (Qwen3), RoPE at ``pos``."""
    y = linear(x, w, b).reshape(x.shape[0], n_heads, head_dim)
    if norm is not None:
        y = rms_norm(y, norm, eps)
    return rope(y, pos, cos, sin)


def attention_inputs(h: torch.Tensor, L: dict, eps: float, n_heads: int, n_kv: int,
                     head_dim: int, pos: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                     want_q: bool = True, store=None):
    """A layer's attention inputs from its residual ``h``: (the rotated query heads
    ``[q, n_heads, head_dim]``, or None without ``want_q``; the KV rows of ``kv_rows``),
    both of ``rms_norm(h, ln1)`` (on the GPU path: one matmul and one RoPE kernel).
    ``store``: ``(kv, slots, kcol)``: the KV rows go to ``kv[slots, kcol:]`` (unique
    slots) and None is returned in their place (on the GPU path, from the RoPE kernel)."""
    x = rms_norm(h, L["ln1"], eps)
    q = (heads(x, L["wq"], L["bq"], L["qn"], n_heads, head_dim, eps, pos, cos, sin)
         if want_q else None)
    rows = kv_rows(x, L, n_kv, head_dim, eps, pos, cos, sin)
    if store is None:
        return q, rows
    kv, slots, kcol = store
    kv[slots, kcol:kcol + rows.shape[1]] = rows
    return q, None


def query(h: torch.Tensor, L: dict, eps: float, n_heads: int, head_dim: int,
          pos: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The rotated query heads of ``rms_norm(h, ln1)``."""
    return heads(rms_norm(h, L["ln1"], eps), L["wq"], L["bq"], L["qn"], n_heads, head_dim,
                 eps, pos, cos, sin)


def kv_rows(x: torch.Tensor, L: dict, n_kv: int, head_dim: int, eps: float,
            pos: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """A layer's KV rows of normed inputs ``x``: rotated K then V, ``[q, 2 * n_kv * hd]``."""
    k = heads(x, L["wk"], L["bk"], L["kn"], n_kv, head_dim, eps, pos, cos, sin)
    return torch.cat([k.reshape(x.shape[0], -1), linear(x, L["wv"], L["bv"])], 1)
