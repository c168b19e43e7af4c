"""Batch-invariant GPU kernels of the HF-family decoder (Triton), the GPU counterpart of
``hf.ops`` (docs/design.md §4.10).

A real engine runs bf16 matmuls and fused attention; the exact path of ``hf.ops``
(float64 grids, fixed binary trees of thousands of tiny kernels) keeps the GPU busy
with work no real model does. These kernels compute in bf16/fp32 like a real model and
stay *bitwise batch invariant* by fixing every reduction order per output row, the
approach of vLLM's batch-invariant mode and SGLang's deterministic inference:

* ``linear``: ``x [M, K] @ w [K, N]``, bf16 operands, fp32 accumulation, one tile
  configuration per weight for every ``M`` (no autotuning): a row's outputs are the
  same sequence of block products whatever rows share its tile or launch; a narrow
  weight's inputs are split into fixed ranges (split-K), each in its own program, and
  the ranges' partial sums added in range order by a second kernel (``Tile``);
* ``rms_norm``: one program per row, the row's sum of squares as one block reduction;
* ``attend``: one program per (query, KV head), reading K and V straight from the paged
  KV cache through the query's own table row, in fixed blocks of positions up to the
  query's last one (an online softmax in block order): nothing a batch-mate or the
  table's width can change.

Epilogues fuse what follows a matmul (bias, residual add; the gated MLP's SiLU and
product) and RoPE is one kernel, so that a layer is a few dozen launches, not hundreds.
Elementwise math and ``argmax`` are batch invariant as they are. Results differ from the exact CPU path's (bf16 weights); a run and
its references (parity's, golden) compute on the same device (``HFModel.exact_on``).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .ops import rope_tables  # noqa: F401  (the same on both paths)

BW = 32                          # attention positions per block
WIDE_ROWS = 32                   # calls of more rows take a tile's wide_bm rows per program

_PDL = None                      # programmatic dependent launch: None = decide on first launch


def pdl() -> bool:
    """Whether the kernels launch with programmatic dependent launch (docs/design.md
    §4.10): on cards of compute capability 9 and up, a kernel's programs may be placed on
    the card while the kernel before it on its stream still runs; each waits there
    (``_after_prior``) until that kernel is done and its writes are visible. It hides the
    seam between back-to-back kernels, not an ordering: every kernel still reads only
    finished results. ``set_pdl`` overrides the choice."""
    global _PDL
    if _PDL is None:
        _PDL = (torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9
                and hasattr(tl.extra.cuda, "gdc_wait"))
    return _PDL


def _gdc() -> dict:
    """A launch's arguments for ``pdl()``: the kernel's ``GDC`` and Triton's launch flag."""
    on = pdl()
    return {"GDC": on, "launch_pdl": on}


def set_pdl(on) -> None:
    """Launch with (True) or without (False) programmatic dependent launch, or decide
    by the card (None). Graphs captured before keep the launches they were captured
    with."""
    global _PDL
    _PDL = None if on is None else bool(on)


class Tile:
    """How ``linear`` and ``gated`` stream one weight: rows per program (``bm`` for a
    call of up to ``WIDE_ROWS`` rows, ``wide_bm`` above), output columns (``bn``) and
    inputs (``bk``) per block product, warps and pipeline stages per program, the
    weight's layout (``kmajor``: stored ``[dout, din]``, each output column's inputs
    contiguous, as ``nn.Linear`` keeps it) and ``split``: the inputs cut into that many
    fixed ranges, each range's block products in its own program (more programs stream
    a narrow weight at once), the ranges' fp32 partial sums then added in range order by
    a second kernel that also runs the epilogue. Everything that orders a row's sums is
    a property of the weight alone, never of the batch: a row's outputs are the same
    block products, summed in the same order, whatever rows share its launch (the
    invariance). Rows per program do not order any sum: a block product of 16 or 64 rows
    gives each row the same bits (``tests/test_hf_kernels_gpu.py`` checks it on the
    device), so the row count may pick them."""

    __slots__ = ("bn", "bk", "warps", "stages", "kmajor", "bm", "split", "wide_bm")

    def __init__(self, bn: int, bk: int, warps: int = 4, stages: int = 3,
                 kmajor: bool = False, bm: int = 16, split: int = 1, wide_bm: int = 0):
        self.bn, self.bk, self.warps, self.stages, self.kmajor = bn, bk, warps, stages, kmajor
        self.bm, self.split, self.wide_bm = bm, split, wide_bm or bm

    def __repr__(self) -> str:
        return (f"Tile(bm={self.bm}, bn={self.bn}, bk={self.bk}, warps={self.warps}, "
                f"stages={self.stages}, kmajor={self.kmajor}, split={self.split}, "
                f"wide_bm={self.wide_bm})")

    def rows(self, m: int) -> int:
        """Rows per program for a call of ``m`` rows."""
        return self.bm if m <= WIDE_ROWS else self.wide_bm

    def span(self, din: int) -> int:
        """Inputs per split range: a whole number of ``bk`` blocks, the last range
        taking what is left (possibly nothing)."""
        return -(-din // (self.split * self.bk)) * self.bk


def tile_for(din: int, dout: int) -> Tile:
    """The tile of a ``[din, dout]`` weight, measured by ``bench/gpu_linear.py --sweep``
    on an H100 for the real-size models' shapes at 1 to 128 rows:

    * stored ``[dout, din]`` (each program reads long runs of contiguous inputs), 64
      outputs per program: 1.2-2x the bandwidth of a ``[din, dout]`` layout;
    * a weight with at least twice as many inputs as outputs (the down projection, a
      narrow O projection) split into 2 ranges, or 4 from three times as many, of at
      least 512 inputs each: its few programs each streamed a long column alone
      (Llama-1B's down projection 24.8 -> 17.1 µs at one row, Qwen3's 10.7 -> 7.6);
    * 256 inputs per block product where the outputs are narrow or a split range is
      short, else 128;
    * 64 rows per program for wide calls (over ``WIDE_ROWS``: batch 32 verifying three
      draft tokens) on the wide weights and the 4-way splits (Llama-1B's gate+up at 128
      rows 108 -> 80 µs, its down projection 46 -> 27 µs), and always on the lm head
      (64 rows halve its 128-row call for 3 % more at 1-4 rows); 16 elsewhere."""
    if dout > 16384:
        return Tile(64, 128, kmajor=True, bm=64)
    split = 4 if din >= 3 * dout else 2 if din >= 2 * dout else 1
    while split > 1 and din // split < 512:
        split //= 2
    if split > 1:
        bk = 256 if din // split < 2048 else 128
    else:
        bk = 256 if dout <= 4096 else 128
    wide = 64 if split == 4 or dout > 4096 else 16
    return Tile(64, bk, kmajor=True, split=split, wide_bm=wide)


class Bf16Weight:
    """A ``[din, dout]`` weight in bf16, contiguous in its tile's layout, as ``linear``
    takes it; ``dense`` is its ``[din, dout]`` view."""

    def __init__(self, w: torch.Tensor, tile: "Tile | None" = None):
        self.shape = tuple(w.shape)
        self.tile = tile or tile_for(*self.shape)
        w = w.to(torch.bfloat16)
        self.w = w.t().contiguous() if self.tile.kmajor else w.contiguous()
        # element strides of the input (k) and output (n) dimensions
        self.sk, self.sn = (1, self.shape[0]) if self.tile.kmajor else (self.shape[1], 1)

    @property
    def dense(self) -> torch.Tensor:
        return self.w.t() if self.tile.kmajor else self.w


def prepare(w):
    """A weight as ``linear`` takes it (``None`` stays ``None``)."""
    return None if w is None else Bf16Weight(w)


@triton.jit
def _after_prior(GDC: tl.constexpr):
    """Launched with programmatic dependent launch (``GDC``): wait until the kernel
    before this one on its stream is done and its writes are visible, then let the next
    kernel's programs be placed (they wait here the same way). First in every kernel:
    nothing is read before it."""
    if GDC:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def _inv_rms(x_ptr, rm, M, K, sx, eps, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """``1 / sqrt(mean(x[rm]**2) + eps)`` per row: each row's sum of squares over blocks
    of ``BLOCK_K`` columns in a fixed order (nothing another row can change)."""
    rk = tl.arange(0, BLOCK_K)
    ss = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        a = tl.load(x_ptr + rm[:, None] * sx + kk[None, :],
                    mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        ss += tl.sum(a * a, axis=1)
    return 1.0 / tl.sqrt(ss / K + eps)


@triton.jit
def _tile(x_ptr, w_ptr, rm, rn, M, N, K, k_lo, k_hi, sx, sk, sn, inv, n_ptr, NORM: tl.constexpr,
          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """``x[rm, k_lo:k_hi] @ w[k_lo:k_hi, rn]``: bf16 block products accumulated in fp32,
    in fixed order; with ``NORM``, ``x``'s rows RMS-normed first (``inv`` per row, weight
    ``n_ptr``). ``k_hi - k_lo`` is a whole number of blocks or ends at ``K``."""
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        kk = k0 + rk
        a = tl.load(x_ptr + rm[:, None] * sx + kk[None, :],
                    mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        if NORM:
            a = a * inv[:, None] * tl.load(n_ptr + kk, mask=kk < K, other=0.0)[None, :]
        b = tl.load(w_ptr + kk[:, None] * sk + rn[None, :] * sn,
                    mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(a.to(b.dtype), b, acc)
    return acc


@triton.jit
def _span(K, SPAN: tl.constexpr, SPLIT: tl.constexpr):
    """This program's input range: all of ``K`` unsplit, else range ``program_id(2)``."""
    k_lo = 0
    k_hi = K
    if SPLIT > 1:
        k_lo = tl.program_id(2) * SPAN
        k_hi = tl.minimum(k_lo + SPAN, K)
    return k_lo, k_hi


@triton.jit
def _partial(p_ptr, y, rm, rn, M, N):
    """Store this range's partial sums at ``p[program_id(2), rm, rn]`` (``[split, M, N]``)."""
    at = p_ptr + tl.program_id(2).to(tl.int64) * M * N + rm[:, None] * N + rn[None, :]
    tl.store(at, y, mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def _sum_parts(p_ptr, rm, rn, M, N, SPLIT: tl.constexpr):
    """``p[0, rm, rn] + p[1, rm, rn] + ...``, added in range order."""
    ok = (rm[:, None] < M) & (rn[None, :] < N)
    at = p_ptr + rm[:, None] * N + rn[None, :]
    y = tl.load(at, mask=ok, other=0.0)
    for s in tl.static_range(1, SPLIT):
        y = y + tl.load(at + s * M * N, mask=ok, other=0.0)
    return y


@triton.jit
def _epilogue(y, b_ptr, r_ptr, y_ptr, rm, rn, M, N, sy, HAS_B: tl.constexpr,
              HAS_R: tl.constexpr):
    ok = (rm[:, None] < M) & (rn[None, :] < N)
    if HAS_B:
        y = y + tl.load(b_ptr + rn, mask=rn < N, other=0.0)[None, :]
    if HAS_R:
        y = tl.load(r_ptr + rm[:, None] * sy + rn[None, :], mask=ok, other=0.0) + y
    tl.store(y_ptr + rm[:, None] * sy + rn[None, :], y, mask=ok)


@triton.jit(do_not_specialize=["M"])
def _linear_kernel(x_ptr, w_ptr, b_ptr, r_ptr, n_ptr, y_ptr, M, N, K, sx, sk, sn, sy, eps,
                   HAS_B: tl.constexpr, HAS_R: tl.constexpr, NORM: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   SPLIT: tl.constexpr, SPAN: tl.constexpr, GDC: tl.constexpr):
    """The matmul and its epilogue; split, only range ``program_id(2)``'s partial sums
    into ``y_ptr`` (``[split, M, N]``), the epilogue left to ``_split_linear_kernel``."""
    _after_prior(GDC)
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    inv = tl.zeros((BLOCK_M,), dtype=tl.float32)
    if NORM:
        inv = _inv_rms(x_ptr, rm, M, K, sx, eps, BLOCK_M, BLOCK_K)
    k_lo, k_hi = _span(K, SPAN, SPLIT)
    y = _tile(x_ptr, w_ptr, rm, rn, M, N, K, k_lo, k_hi, sx, sk, sn, inv, n_ptr, NORM,
              BLOCK_M, BLOCK_N, BLOCK_K)
    if SPLIT == 1:
        _epilogue(y, b_ptr, r_ptr, y_ptr, rm, rn, M, N, sy, HAS_B, HAS_R)
    else:
        _partial(y_ptr, y, rm, rn, M, N)


@triton.jit(do_not_specialize=["M"])
def _split_linear_kernel(p_ptr, b_ptr, r_ptr, y_ptr, M, N, sy, HAS_B: tl.constexpr,
                         HAS_R: tl.constexpr, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, GDC: tl.constexpr):
    _after_prior(GDC)
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    y = _sum_parts(p_ptr, rm, rn, M, N, SPLIT)
    _epilogue(y, b_ptr, r_ptr, y_ptr, rm, rn, M, N, sy, HAS_B, HAS_R)


@triton.jit
def _silu_mul(g, u):
    return g / (1.0 + tl.exp(-g)) * u


@triton.jit(do_not_specialize=["M"])
def _gated_kernel(x_ptr, g_ptr, u_ptr, n_ptr, y_ptr, M, N, K, sx, sk, sn, sy, eps,
                  NORM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, SPLIT: tl.constexpr, SPAN: tl.constexpr,
                  GDC: tl.constexpr):
    """Both products and ``silu(g) * u``; split, range ``program_id(2)``'s partial sums
    of ``g`` and of ``u`` into ``y_ptr`` (``[2, split, M, N]``), for
    ``_split_gated_kernel``."""
    _after_prior(GDC)
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    inv = tl.zeros((BLOCK_M,), dtype=tl.float32)
    if NORM:
        inv = _inv_rms(x_ptr, rm, M, K, sx, eps, BLOCK_M, BLOCK_K)
    k_lo, k_hi = _span(K, SPAN, SPLIT)
    g = _tile(x_ptr, g_ptr, rm, rn, M, N, K, k_lo, k_hi, sx, sk, sn, inv, n_ptr, NORM,
              BLOCK_M, BLOCK_N, BLOCK_K)
    u = _tile(x_ptr, u_ptr, rm, rn, M, N, K, k_lo, k_hi, sx, sk, sn, inv, n_ptr, NORM,
              BLOCK_M, BLOCK_N, BLOCK_K)
    if SPLIT == 1:
        tl.store(y_ptr + rm[:, None] * sy + rn[None, :], _silu_mul(g, u),
                 mask=(rm[:, None] < M) & (rn[None, :] < N))
    else:
        _partial(y_ptr, g, rm, rn, M, N)
        _partial(y_ptr + SPLIT * M * N, u, rm, rn, M, N)


@triton.jit(do_not_specialize=["M"])
def _split_gated_kernel(p_ptr, y_ptr, M, N, sy, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, GDC: tl.constexpr):
    _after_prior(GDC)
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    g = _sum_parts(p_ptr, rm, rn, M, N, SPLIT)
    u = _sum_parts(p_ptr + SPLIT * M * N, rm, rn, M, N, SPLIT)
    tl.store(y_ptr + rm[:, None] * sy + rn[None, :], _silu_mul(g, u),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


SUM_M, SUM_N = 16, 128           # the partial-sum kernels' block


def _rows(x: torch.Tensor, din: int) -> torch.Tensor:
    return x.reshape(-1, din).float().contiguous()


def linear(x: torch.Tensor, w, b=None, residual=None, norm=None, eps: float = 0.0) -> torch.Tensor:
    """``(residual +) x @ w (+ b)`` for ``x [..., din]`` (float32) and a ``Bf16Weight``;
    float32, bias and residual added in the matmul's epilogue. With ``norm`` (an RMSNorm
    weight), ``x``'s rows are RMS-normed first, in the matmul's prologue."""
    if not isinstance(w, Bf16Weight):
        w = Bf16Weight(w)
    din, dout = w.shape
    flat = _rows(x, din)
    m = flat.shape[0]
    y = torch.empty((m, dout), dtype=torch.float32, device=x.device)
    if m:
        r = None if residual is None else _rows(residual, dout)
        bias = None if b is None else b.float().contiguous()
        nw = None if norm is None else norm.float().contiguous()
        t = w.tile
        part = y if t.split == 1 else torch.empty((t.split, m, dout), dtype=torch.float32,
                                                  device=x.device)
        bm = t.rows(m)
        grid = (triton.cdiv(m, bm), triton.cdiv(dout, t.bn), t.split)
        _linear_kernel[grid](flat, w.w, y if bias is None else bias, y if r is None else r,
                             y if nw is None else nw, part, m, dout, din, flat.stride(0),
                             w.sk, w.sn, y.stride(0), float(eps),
                             HAS_B=bias is not None, HAS_R=r is not None, NORM=nw is not None,
                             BLOCK_M=bm, BLOCK_N=t.bn, BLOCK_K=t.bk, SPLIT=t.split,
                             SPAN=t.span(din), num_warps=t.warps, num_stages=t.stages, **_gdc())
        if t.split > 1:
            grid = (triton.cdiv(m, SUM_M), triton.cdiv(dout, SUM_N))
            _split_linear_kernel[grid](part, y if bias is None else bias,
                                       y if r is None else r, y, m, dout, y.stride(0),
                                       HAS_B=bias is not None, HAS_R=r is not None,
                                       SPLIT=t.split, BLOCK_M=SUM_M, BLOCK_N=SUM_N, **_gdc())
    return y.reshape(*x.shape[:-1], dout)


def gated(x: torch.Tensor, wg, wu, norm=None, eps: float = 0.0) -> torch.Tensor:
    """``silu(x @ wg) * (x @ wu)`` in one kernel (both products share the tile loop);
    with ``norm``, of ``x``'s RMS-normed rows (the norm in the prologue)."""
    din, dout = wg.shape
    flat = _rows(x, din)
    m = flat.shape[0]
    y = torch.empty((m, dout), dtype=torch.float32, device=x.device)
    if m:
        nw = None if norm is None else norm.float().contiguous()
        t = wg.tile
        if (wu.tile.kmajor, wu.sk, wu.sn, wu.tile.split) != (t.kmajor, wg.sk, wg.sn, t.split):
            raise ValueError("gated: the two weights are laid out differently")
        part = y if t.split == 1 else torch.empty((2, t.split, m, dout), dtype=torch.float32,
                                                  device=x.device)
        bm = t.rows(m)
        grid = (triton.cdiv(m, bm), triton.cdiv(dout, t.bn), t.split)
        _gated_kernel[grid](flat, wg.w, wu.w, y if nw is None else nw, part, m, dout, din,
                            flat.stride(0), wg.sk, wg.sn, y.stride(0), float(eps),
                            NORM=nw is not None, BLOCK_M=bm, BLOCK_N=t.bn, BLOCK_K=t.bk,
                            SPLIT=t.split, SPAN=t.span(din), num_warps=t.warps,
                            num_stages=t.stages, **_gdc())
        if t.split > 1:
            grid = (triton.cdiv(m, SUM_M), triton.cdiv(dout, SUM_N))
            _split_gated_kernel[grid](part, y, m, dout, y.stride(0), SPLIT=t.split,
                                      BLOCK_M=SUM_M, BLOCK_N=SUM_N, **_gdc())
    return y.reshape(*x.shape[:-1], dout)


def norm_gated(h: torch.Tensor, ln, eps: float, wg, wu) -> torch.Tensor:
    """``gated(rms_norm(h, ln, eps), wg, wu)``: one kernel, the norm in its prologue."""
    return gated(h, wg, wu, norm=ln, eps=eps)


@triton.jit(do_not_specialize=["R"])
def _rms_kernel(x_ptr, w_ptr, y_ptr, R, D, eps, BLOCK: tl.constexpr, GDC: tl.constexpr):
    _after_prior(GDC)
    r = tl.program_id(0)
    d = tl.arange(0, BLOCK)
    ok = d < D
    x = tl.load(x_ptr + r * D + d, mask=ok, other=0.0)
    ss = tl.sum(x * x, axis=0)
    w = tl.load(w_ptr + d, mask=ok, other=0.0)
    y = x / tl.sqrt(ss / D + eps) * w
    tl.store(y_ptr + r * D + d, y, mask=ok)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension, one program per row."""
    d = x.shape[-1]
    flat = x.reshape(-1, d).float().contiguous()
    y = torch.empty_like(flat)
    if flat.shape[0]:
        _rms_kernel[(flat.shape[0],)](flat, w.float().contiguous(), y, flat.shape[0], d,
                                      float(eps), BLOCK=triton.next_power_of_2(d), **_gdc())
    return y.reshape(x.shape)


def silu(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.silu(x)


@triton.jit(do_not_specialize=["R"])
def _rope_store_kernel(x_ptr, pos_ptr, cos_ptr, sin_ptr, w_ptr, kv_ptr, slot_ptr, R, heads, nq,
                       nkv, sx, skv, kcol, HALF, woff, eps, NORM: tl.constexpr,
                       BLOCK: tl.constexpr, GDC: tl.constexpr):
    """Every head vector of a token's Q, K and V heads (``nq``, ``nkv``, ``nkv``), one per
    program (row ``r`` is head ``r % heads`` of token ``r // heads``; a token's heads are
    ``sx`` apart): Q heads (RMSNorm, when ``NORM``, weight at ``w_ptr``, then) rotate-half
    RoPE, in place; K heads normed (weight at ``w_ptr + woff``) and rotated, and V heads
    as they are, go to the token's slot of the paged KV (``kv[slot, kcol:]``, K then V),
    which may be the rows they came from. The only RoPE kernel: a head's bits never
    depend on where it goes."""
    _after_prior(GDC)
    r = tl.program_id(0)
    t = r // heads
    h = r % heads
    is_q = h < nq
    is_v = h >= nq + nkv
    p = tl.load(pos_ptr + t)
    d = tl.arange(0, BLOCK)
    ok = d < HALF
    src = x_ptr + t * sx + h * 2 * HALF
    x1 = tl.load(src + d, mask=ok, other=0.0)
    x2 = tl.load(src + HALF + d, mask=ok, other=0.0)
    if NORM:
        w = w_ptr + tl.where(is_q, 0, woff)
        inv = 1.0 / tl.sqrt((tl.sum(x1 * x1, axis=0) + tl.sum(x2 * x2, axis=0)) / (2 * HALF) + eps)
        n1 = x1 * inv * tl.load(w + d, mask=ok, other=0.0)
        n2 = x2 * inv * tl.load(w + HALF + d, mask=ok, other=0.0)
        x1 = tl.where(is_v, x1, n1)
        x2 = tl.where(is_v, x2, n2)
    c = tl.load(cos_ptr + p * HALF + d, mask=ok, other=0.0)
    s = tl.load(sin_ptr + p * HALF + d, mask=ok, other=0.0)
    y1 = tl.where(is_v, x1, x1 * c - x2 * s)
    y2 = tl.where(is_v, x2, x1 * s + x2 * c)
    hh = d * 0 + h                          # the head, per lane (masks are per lane)
    to_q = ok & (hh < nq)
    tl.store(src + d, y1, mask=to_q)
    tl.store(src + HALF + d, y2, mask=to_q)
    to_kv = ok & (hh >= nq)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    dst = kv_ptr + slot * skv + kcol + (h - nq) * 2 * HALF
    tl.store(dst + d, y1, mask=to_kv)
    tl.store(dst + HALF + d, y2, mask=to_kv)


def rope(x: torch.Tensor, pos: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE of ``x [q, heads, hd]`` at positions ``pos [q]``, one kernel."""
    q, n_heads, hd = x.shape
    y = x.float().contiguous().clone().view(q, -1)
    _rope_store(y, None, n_heads, 0, hd, 0.0, pos, cos, sin, y, pos, 0)
    return y.view(q, n_heads, hd)


def heads(x, w, b, norm, n_heads: int, head_dim: int, eps: float, pos, cos, sin):
    """``ops.heads``: the linear, then the per-head norm and RoPE in one kernel."""
    y = linear(x, w, b)
    _rope_store(y, norm, n_heads, 0, head_dim, eps, pos, cos, sin, y, pos, 0)
    return y.view(x.shape[0], n_heads, head_dim)


def layer_weights(L: dict) -> dict:
    """A layer's prepared weights plus K and V side by side (``wkv``, ``bkv``: one
    matmul makes a token's whole KV row) and Q, K and V side by side (``wqkv``,
    ``bqkv``, and ``qkn``, the Q and K head norms: one matmul and one norm-and-RoPE
    kernel make a token's query and KV row)."""
    L = dict(L)
    L["wqkv"] = Bf16Weight(torch.cat([L["wq"].dense, L["wk"].dense, L["wv"].dense], 1))
    # Q alone and K|V alone in the fused weight's tile: the same sums, so the same bits
    # as their columns of Q|K|V (a narrower weight's own tile may split its inputs)
    tile = L["wqkv"].tile
    L["wkv"] = Bf16Weight(torch.cat([L["wk"].dense, L["wv"].dense], 1), tile)
    if repr(L["wq"].tile) != repr(tile):
        L["wq"] = Bf16Weight(L["wq"].dense, tile)
    L["bkv"] = None if L.get("bk") is None else torch.cat([L["bk"], L["bv"]]).float()
    biases = [(L.get(n), L[w].shape[1]) for n, w in (("bq", "wq"), ("bk", "wk"), ("bv", "wv"))]
    L["bqkv"] = (None if all(b is None for b, _ in biases) else
                 torch.cat([L["wq"].w.new_zeros(n, dtype=torch.float32) if b is None
                            else b.float() for b, n in biases]))
    # both heads normed (Qwen3) or neither (Llama, Qwen2): one kernel for Q and K
    L["qkn"] = (torch.cat([L["qn"], L["kn"]]).float().contiguous()
                if L.get("qn") is not None and L.get("kn") is not None else None)
    L["fuse_qk"] = (L.get("qn") is None) == (L.get("kn") is None)
    return L


def attention_inputs(h, L: dict, eps: float, n_heads: int, n_kv: int, head_dim: int, pos,
                     cos, sin, want_q: bool = True, store=None):
    """``ops.attention_inputs``: the layer's input norm folded into one matmul (Q, K and
    V side by side, or K and V alone), then the heads' norms and RoPE in one kernel.
    ``store``: ``(kv, slots, kcol)`` to write the KV rows into ``kv[slots, kcol:]`` in
    that same kernel (slots unique); the KV part returned is then None. Q, K and V come
    from one kernel with or without ``store`` (and ``query`` too), so their bits never
    depend on where the rows go."""
    qw = n_heads * head_dim if want_q else 0
    if want_q and not L["fuse_qk"]:     # one of the two heads normed: two kernels
        q = query(h, L, eps, n_heads, head_dim, pos, cos, sin)
        return q, attention_inputs(h, L, eps, n_heads, n_kv, head_dim, pos, cos, sin, False,
                                   store)[1]
    y = (linear(h, L["wqkv"], L["bqkv"], norm=L["ln1"], eps=eps) if want_q else
         linear(h, L["wkv"], L["bkv"], norm=L["ln1"], eps=eps))
    t = y.shape[0]
    q = y[:, :qw].view(t, n_heads, head_dim) if want_q else None
    if store is None:     # the same kernel, storing into rows of its own
        rows = torch.empty((t, 2 * n_kv * head_dim), dtype=y.dtype, device=y.device)
        _rope_store(y, L["qkn"] if want_q else L["kn"], n_heads if want_q else 0, n_kv,
                    head_dim, eps, pos, cos, sin, rows,
                    torch.arange(t, device=y.device), 0)
        return q, rows
    kv, slots, kcol = store
    _rope_store(y, L["qkn"] if want_q else L["kn"], n_heads if want_q else 0, n_kv, head_dim,
                eps, pos, cos, sin, kv, slots, kcol)
    return q, None


def _rope_store(y, norm, nq: int, nkv: int, head_dim: int, eps, pos, cos, sin, kv, slots,
                kcol: int) -> None:
    """``_rope_store_kernel`` over the rows of ``y`` (``nq`` Q heads, then ``nkv`` K and
    ``nkv`` V heads): Q in place, K and V to ``kv[slots, kcol:]``."""
    t = y.shape[0]
    heads = nq + 2 * nkv
    if t and heads:
        _rope_store_kernel[(t * heads,)](
            y, pos.contiguous(), cos, sin, y if norm is None else norm, kv, slots.contiguous(),
            t * heads, heads, nq, nkv, y.stride(0), kv.stride(0), kcol, head_dim // 2,
            head_dim if nq and norm is not None and norm.numel() > head_dim else 0, float(eps),
            NORM=norm is not None, BLOCK=triton.next_power_of_2(head_dim // 2), **_gdc())


def query(h, L: dict, eps: float, n_heads: int, head_dim: int, pos, cos, sin):
    """``ops.query``: the input norm folded into the Q matmul, then the heads' norm and
    RoPE."""
    y = linear(h, L["wq"], L["bq"], norm=L["ln1"], eps=eps)
    _rope_store(y, L["qn"], n_heads, 0, head_dim, eps, pos, cos, sin, y, pos, 0)   # Q only
    return y.view(h.shape[0], n_heads, head_dim)


def kv_rows(x, L: dict, n_kv: int, head_dim: int, eps: float, pos, cos, sin):
    """``ops.kv_rows``: K and V from one matmul, K's norm and RoPE in place."""
    y = linear(x, L["wkv"], L["bkv"])
    _rope_store(y, L["kn"], 0, n_kv, head_dim, eps, pos, cos, sin, y,
                torch.arange(y.shape[0], device=y.device), 0)
    return y


ARGMAX_BLOCK = 4096              # logits per argmax program (a row's blocks, in order)


@triton.jit(do_not_specialize=["n"])
def _argmax_parts_kernel(x_ptr, val_ptr, idx_ptr, n, vocab, sx, NB,
                         BLOCK: tl.constexpr, GDC: tl.constexpr):
    """Per (row, block of ``BLOCK`` logits): the block's largest logit and the first
    column holding it."""
    _after_prior(GDC)
    r = tl.program_id(0)
    b = tl.program_id(1)
    cols = b * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + r.to(tl.int64) * sx + cols, mask=cols < vocab, other=float("-inf"))
    m, i = tl.max(x, axis=0, return_indices=True, return_indices_tie_break_left=True)
    tl.store(val_ptr + r * NB + b, m)
    tl.store(idx_ptr + r * NB + b, b * BLOCK + i)


@triton.jit(do_not_specialize=["n"])
def _sample_kernel(val_ptr, idx_ptr, seed_ptr, pos_ptr, on_ptr, y_ptr, n, vocab, NB,
                   M: tl.constexpr, PERCENT: tl.constexpr, BLOCK: tl.constexpr,
                   BLOCK_B: tl.constexpr, GDC: tl.constexpr):
    """``ops.sample`` for ``BLOCK`` rows from their blocks' maxima: the greedy token (the
    first column of the row's largest logit, as ``argmax``), then the integer tail: the
    seeded token, a pure function of (seed, position, greedy token), where ``seeded``
    says so."""
    _after_prior(GDC)
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < n
    bb = tl.arange(0, BLOCK_B)
    at = i[:, None] * NB + bb[None, :]
    part = ok[:, None] & (bb[None, :] < NB)
    v = tl.load(val_ptr + at, mask=part, other=float("-inf"))
    c = tl.load(idx_ptr + at, mask=part, other=0)
    top = tl.max(v, axis=1)
    g = tl.min(tl.where(part & (v == top[:, None]), c, vocab), axis=1)
    g = tl.where(g < vocab, g, 0)          # no block equals the top: a NaN row
    x = tl.load(seed_ptr + i, mask=ok, other=0) % M
    x = tl.where(x < 0, x + M, x)          # torch's % is a floor modulo, Triton's truncates
    y = tl.load(pos_ptr + i, mask=ok, other=0) + 1
    u = (x * 48271 + (y % M) * 69621 + 12345) % M      # oracle_rule.mix(x, y)
    u = u ^ (u >> 11)
    other = (g + 1 + (u >> 7) % (vocab - 1)) % vocab
    on = tl.load(on_ptr + i, mask=ok, other=0) != 0
    tl.store(y_ptr + i, tl.where(on & (u % 100 < PERCENT), other, g), mask=ok)


def sample(logits: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor,
           seeded: torch.Tensor, vocab: int, percent: int, modulus: int) -> torch.Tensor:
    """``ops.sample`` in two kernels: each row's blocks' maxima (many programs per row:
    ``argmax`` over a large vocabulary with few programs per row left most of the card
    idle), then per row the first column of the largest and its integer tail. The greedy
    token is ``argmax``'s: the first column holding the row's maximum."""
    shape = logits.shape[:-1]
    rows = logits.reshape(-1, logits.shape[-1])
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    n, width = rows.shape
    out = torch.empty(shape, dtype=torch.int64, device=logits.device)
    if n:
        nb = triton.cdiv(width, ARGMAX_BLOCK)
        val = torch.empty((n, nb), dtype=rows.dtype, device=rows.device)
        idx = torch.empty((n, nb), dtype=torch.int64, device=rows.device)
        _argmax_parts_kernel[(n, nb)](rows, val, idx, n, width, rows.stride(0), nb,
                                      BLOCK=ARGMAX_BLOCK, num_warps=8, **_gdc())
        flat = lambda t: torch.broadcast_to(t, shape).reshape(-1).contiguous()  # noqa: E731
        _sample_kernel[(triton.cdiv(n, 32),)](
            val, idx, flat(seeds).long(), flat(positions).long(),
            flat(seeded).to(torch.int8), out.view(-1), n, vocab, nb, M=modulus,
            PERCENT=percent, BLOCK=32, BLOCK_B=triton.next_power_of_2(nb), **_gdc())
    return out


@triton.jit(do_not_specialize=["n"])
def _attend_kernel(q_ptr, kv_ptr, table_ptr, rows_ptr, last_ptr, o_ptr, n, stable, skv, kcol,
                   vcol, HD, scale, GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
                   BLOCK_W: tl.constexpr, BLOCK_D: tl.constexpr, GDC: tl.constexpr):
    _after_prior(GDC)
    i = tl.program_id(0)
    g = tl.program_id(1)
    heads = tl.num_programs(1) * GROUP
    row = tl.load(rows_ptr + i)
    last = tl.load(last_ptr + i)
    hh = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    qm = (hh[:, None] < GROUP) & (d[None, :] < HD)
    qoff = (i * heads + g * GROUP + hh)[:, None] * HD + d[None, :]
    q = tl.load(q_ptr + qoff, mask=qm, other=0.0)                      # [G, D]
    m = tl.full((BLOCK_G,), float("-inf"), tl.float32)
    total = tl.zeros((BLOCK_G,), tl.float32)
    acc = tl.zeros((BLOCK_G, BLOCK_D), tl.float32)
    for w0 in range(0, last + 1, BLOCK_W):
        w = w0 + tl.arange(0, BLOCK_W)
        ok = w <= last
        slot = tl.load(table_ptr + row * stable + w, mask=ok, other=0)
        at = kv_ptr + slot[:, None] * skv + g * HD + d[None, :]
        km = ok[:, None] & (d[None, :] < HD)
        k = tl.load(at + kcol, mask=km, other=0.0)                      # [W, D]
        s = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale      # [G, W]
        s = tl.where(ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        total = total * alpha + tl.sum(p, axis=1)
        v = tl.load(at + vcol, mask=km, other=0.0)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        m = m_new
    tl.store(o_ptr + qoff, acc / total[:, None], mask=qm)


class Context:
    """The context of each query: its request row of ``table`` and its last position
    (attention reads positions ``0..last``), gathered inside ``attend``."""

    def __init__(self, table: torch.Tensor, rows: torch.Tensor, last: torch.Tensor):
        self.table = table.contiguous()
        self.rows = rows.contiguous()
        self.last = last.contiguous()
        self.shape = (rows.shape[0], table.shape[1])


def context_slots(table: torch.Tensor, rows: torch.Tensor, last: torch.Tensor):
    """``(Context, None)``: what ``attend`` reads in place of ``ops.context_slots``'
    slots and mask (no ``[queries, width]`` tensors: each query reads its own row)."""
    return Context(table, rows, last), None


def attend(q: torch.Tensor, kv: torch.Tensor, cols, ctx: Context, _mask,
           kv_heads: int) -> torch.Tensor:
    """Grouped-query attention of ``q [n, H, hd]`` over the K columns ``cols[0]:cols[1]``
    and V columns ``cols[1]:cols[2]`` of ``kv``'s rows at each query's positions
    ``0..last`` (``ctx``); ``[n, H, hd]``. One program per (query, KV head) reads each K
    and V row once for the head's group of queries: an online softmax over blocks of
    positions in a fixed order, up to the query's own last position."""
    n, heads, hd = q.shape
    out = torch.empty((n, heads, hd), dtype=torch.float32, device=q.device)
    if n:
        if kv.dtype != torch.float32 or kv.stride(1) != 1:
            raise ValueError("attend reads a float32 KV cache with contiguous rows")
        group = heads // kv_heads
        _attend_kernel[(n, kv_heads)](
            q.float().contiguous(), kv, ctx.table, ctx.rows, ctx.last, out, n,
            ctx.table.stride(0), kv.stride(0), cols[0], cols[1], hd, 1.0 / math.sqrt(hd),
            GROUP=group, BLOCK_G=max(2, triton.next_power_of_2(group)), BLOCK_W=BW,
            BLOCK_D=triton.next_power_of_2(hd), **_gdc())
    return out
