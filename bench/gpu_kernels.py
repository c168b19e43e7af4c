"""Device kernels per steady decode step, by name (docs/design.md §8): how many kernels a
step launches, how much device time each kind takes, and the idle seams between them.
Under CUDA graphs a step's launches cost the host nothing, but every kernel boundary
still leaves the GPU idle for about a microsecond; this says where those boundaries
come from.

    python bench/gpu_kernels.py --model random:llama-1b --batch 1 --mode overlap
"""
from __future__ import annotations

import argparse
import collections
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import gpu_observe as obs  # noqa: E402
import gpu_overlap as G  # noqa: E402
from fake_models import make_model  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="random:llama-1b")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--mode", default="overlap", choices=[m[0] for m in G.MODES])
    ap.add_argument("--steps", type=int, default=12, help="steps in the profiled window")
    ap.add_argument("--rows", type=int, default=25, help="kernel names printed")
    ap.add_argument("--draft", default="standalone")
    obs.add_pdl_arg(ap)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        ap.error("needs a CUDA device")
    pdl = obs.apply_pdl(ap, args.pdl, "cuda")
    ns = argparse.Namespace(device="cuda", steps=args.steps, settle=3, windows=1, tol=0.03,
                            prompt=16, row_width=384, page_size=16, spec_steps=3,
                            draft=args.draft, graphs=True)
    model = make_model(args.model)
    G.run_mode(ns, args.model, model, args.batch, args.mode)        # warm-up and captures
    prof = obs.profiler("cuda")
    got, _ = G.run_mode(ns, args.model, model, args.batch, args.mode, hooks={
        "start": prof.__enter__, "after": lambda: prof.__exit__(None, None, None)}, windows=1)
    steps = got["steps"]
    count, time_us = collections.Counter(), collections.Counter()
    for e in prof.events():
        if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA:
            count[e.name] += 1
            time_us[e.name] += e.time_range.end - e.time_range.start
    seams, waits = obs.idle_gaps_us(prof)
    busy, _ = obs.kernel_busy_us(prof)
    print(f"{args.model} B={args.batch} {args.mode}: {sum(count.values()) / steps:.0f} kernels "
          f"per step, {busy / steps / 1e3:.3f} ms busy, idle {seams / steps / 1e3:.3f} ms in "
          f"seams under 10 us and {waits / steps / 1e3:.3f} ms in longer gaps per step "
          f"(dependent launch {'on' if pdl else 'off'})")
    print(f"{'per step':>9s} {'us/step':>9s}  kernel")
    for name, n in count.most_common(args.rows):
        print(f"{n / steps:9.1f} {time_us[name] / steps:9.1f}  {name[:110]}")


if __name__ == "__main__":
    main()
