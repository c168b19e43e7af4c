"""Weight bandwidth of the batch-invariant matmuls of the real-size models (docs/design.md
§8.1): for each matmul of a layer (Q/K/V with the input norm, O with the residual, the
gated MLP with its norm, the down projection) and the lm head, the time of one call at M
rows and the weight bytes it streams per second. A decode step's matmuls are memory
bound: each call reads its whole weight once, so GB/s against the card's peak says how
far a step's GPU time is from a real engine's.

    python bench/gpu_linear.py                                   # the tiles in use
    python bench/gpu_linear.py --sweep --json bench-out/linear.json

``--sweep`` times every tile of ``--tiles`` (layout, rows, output columns, inputs per
block, warps, stages, split-K ranges) per shape and prints the fastest beside the one in use, and checks that
the fastest keeps a row's outputs bitwise the same alone and in a batch. Calls are timed
from a CUDA graph of back-to-back calls over enough copies of the weight that none is
read from L2.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fake_models.hf.config import SIZES  # noqa: E402

L2_FLUSH_BYTES = 256 << 20      # weight copies per shape: at least this many bytes in all


def shapes(name: str):
    """(label, din, dout, kind) of a model's matmuls; kind: "norm" (input RMSNorm in the
    prologue), "residual" (residual add in the epilogue), "gated", "plain"."""
    c = SIZES[name][0]
    d, f, h = c.hidden_size, c.intermediate_size, c.head_dim
    q, kv = c.num_attention_heads * h, c.num_key_value_heads * h
    return [("qkv", d, q + 2 * kv, "norm"), ("o", q, d, "residual"),
            ("gate+up", d, f, "gated"), ("down", f, d, "residual"),
            ("head", d, c.vocab_size, "plain")]


def parse_tiles(text: str):
    """``kn|km:bm:bn:bk:warps:stages[:split]`` items, comma separated, a field may list
    values ``a/b/c``: (bn, bk, warps, stages, kmajor, bm, split) per tile. ValueError
    names a bad item."""
    out = []
    for item in text.split(","):
        parts = item.strip().split(":")
        if len(parts) not in (6, 7):
            raise ValueError(f"tile '{item}' is not layout:bm:bn:bk:warps:stages[:split]")
        if len(parts) == 6:
            parts.append("1")
        try:
            nums = [[int(v) for v in p.split("/")] for p in parts[1:]]
        except ValueError:
            raise ValueError(f"tile '{item}' has a non-integer field") from None
        if any(v <= 0 for vs in nums for v in vs):
            raise ValueError(f"tile '{item}' has a field below 1")
        for lay in parts[0].split("/"):
            if lay not in ("kn", "km"):
                raise ValueError(f"tile '{item}': layout '{lay}' is not kn or km")
            for bm, bn, bk, w, s, sp in itertools.product(*nums):
                out.append((bn, bk, w, s, lay == "km", bm, sp))
    return out


def _call(T, kind, x, ws, norm, res, i):
    if kind == "gated":
        g, u = ws[i]
        return T.gated(x, g, u, norm=norm, eps=1e-6)
    w = ws[i]
    if kind == "norm":
        return T.linear(x, w, norm=norm, eps=1e-6)
    if kind == "residual":
        return T.linear(x, w, residual=res)
    return T.linear(x, w)


def time_shape(T, din, dout, kind, rows, tile, reps: int = 20, iters: int = 10):
    """(µs per call at each of ``rows``, whether a row alone equals it in a batch)."""
    gen = torch.Generator(device="cuda").manual_seed(din * 7 + dout)
    per = din * dout * 2 * (2 if kind == "gated" else 1)
    copies = max(1, -(-L2_FLUSH_BYTES // per))
    copies = min(copies, reps)

    def weight():
        w = torch.randn(din, dout, device="cuda", generator=gen) / din ** 0.5
        return T.Bf16Weight(w, tile)
    ws = [(weight(), weight()) if kind == "gated" else weight() for _ in range(copies)]
    norm = torch.rand(din, device="cuda", generator=gen) + 0.5
    out = {}
    invariant = True
    for m in rows:
        x = torch.randn(m, din, device="cuda", generator=gen)
        res = torch.randn(m, dout, device="cuda", generator=gen)
        y = _call(T, kind, x, ws, norm, res, 0)          # compiles
        alone = _call(T, kind, x[:1].clone(), ws, norm, res[:1].clone(), 0)
        invariant = invariant and bool(torch.equal(alone, y[:1]))
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for i in range(copies):
                _call(T, kind, x, ws, norm, res, i)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for i in range(reps):
                _call(T, kind, x, ws, norm, res, i % copies)
        for _ in range(3):
            g.replay()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            g.replay()
        b.record()
        b.synchronize()
        out[m] = a.elapsed_time(b) * 1e3 / (iters * reps)
        del g
    return out, invariant


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="llama-1b,qwen3-0.6b")
    ap.add_argument("--rows", default="1,4,32,128", help="M values (batch rows per call)")
    ap.add_argument("--sweep", action="store_true", help="time every tile of --tiles too")
    ap.add_argument("--tiles", default="kn/km:16:16/32/64:64/128/256:4:3/4",
                    help="tiles the sweep tries: layout:bm:bn:bk:warps:stages[:split], a "
                         "field may list values a/b/c (layout kn: [din, dout]; km: [dout, "
                         "din]; split: input ranges summed by a second kernel, default 1)")
    ap.add_argument("--peak-gbs", type=float, default=0.0,
                    help="the card's memory bandwidth, GB/s (default: from its name)")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    try:
        rows = [int(v) for v in args.rows.split(",")]
    except ValueError:
        ap.error(f"--rows: '{args.rows}' is not a list of integers")
    if min(rows) < 1:
        ap.error(f"--rows: '{args.rows}' has a value below 1")
    models = args.models.split(",")
    for m in models:
        if m not in SIZES:
            ap.error(f"--models: unknown size '{m}' (known: {', '.join(sorted(SIZES))})")
    try:
        tiles = parse_tiles(args.tiles) if args.sweep else []
    except ValueError as e:
        ap.error(f"--tiles: {e}")
    if not torch.cuda.is_available():
        ap.error("needs a CUDA device")
    from fake_models.hf import triton_ops as T
    tiles = [T.Tile(bn, bk, w, s, kmajor=km, bm=bm, split=sp)
             for bn, bk, w, s, km, bm, sp in tiles]
    card = torch.cuda.get_device_name()
    peak = args.peak_gbs or (4800.0 if "H200" in card else 3350.0 if "H100" in card else 0.0)
    print(f"card: {card}; peak {peak:.0f} GB/s" if peak else f"card: {card}")
    rec = {"card": card, "peak_gbs": peak, "rows": rows, "shapes": []}
    for name in models:
        for label, din, dout, kind in shapes(name):
            per = din * dout * 2 * (2 if kind == "gated" else 1)
            cur_tile = T.tile_for(din, dout)
            cur, inv = time_shape(T, din, dout, kind, rows, cur_tile)
            entry = {"model": name, "shape": label, "din": din, "dout": dout, "kind": kind,
                     "tile": repr(cur_tile), "us": cur, "invariant": inv, "sweep": []}
            best = None
            for t in tiles:
                try:
                    us, tinv = time_shape(T, din, dout, kind, rows, t)
                except Exception as e:  # noqa: BLE001 - a tile Triton cannot build
                    entry["sweep"].append({"tile": repr(t), "error": str(e).splitlines()[0][:120]})
                    continue
                entry["sweep"].append({"tile": repr(t), "us": us, "invariant": tinv})
                score = sum(us.values())
                if tinv and (best is None or score < best[0]):
                    best = (score, t, us)
            for m in rows:
                gbs = per / (cur[m] * 1e-6) / 1e9
                line = (f"{name:11s} {label:8s} {din:6d}x{dout:<7d} M={m:<4d} {cur[m]:8.1f} us "
                        f"{gbs:7.0f} GB/s" + (f" ({100 * gbs / peak:3.0f}%)" if peak else ""))
                if best is not None:
                    bg = per / (best[2][m] * 1e-6) / 1e9
                    line += (f" | best {best[2][m]:8.1f} us {bg:7.0f} GB/s"
                             + (f" ({100 * bg / peak:3.0f}%)" if peak else ""))
                print(line + ("" if inv else "  NOT INVARIANT"), flush=True)
            if best is not None:
                print(f"{'':20s} in use {cur_tile}; best {best[1]}", flush=True)
                entry["best"] = repr(best[1])
            rec["shapes"].append(entry)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as fh:
            json.dump(rec, fh, indent=1)


if __name__ == "__main__":
    main()
