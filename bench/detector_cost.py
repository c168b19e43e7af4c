"""Detector cost per tracked op, on the sim (and on cuda when a GPU is present).

Prints, per device and access mode, microseconds per launch of a small kernel that
reads one tracked buffer and writes another, with the detector off and on; and the
cost of one access check in the detector core alone, against the number of tracked
buffers (it should not grow with memory size).

    python bench/detector_cost.py [--launches N] [--device sim|cuda|all] [--json]
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from overlapcheck.device import make_runtime
from overlapcheck.race import Detector, OpInfo


def _kernel(src, dst):
    dst.add_(src)


def bench_launches(device: str, detect: bool, access: str, n: int) -> float:
    rt = make_runtime(device, seed=0, strategy="eager", detect=detect, access=access)
    s, f = rt.new_stream("schedule"), rt.new_stream("forward")
    a = rt.empty((64,), torch.float32, "a", s)
    b = rt.empty((64,), torch.float32, "b", f)
    ev = rt.new_event("e")
    declared = {"reads": [a], "writes": [b]}
    rt.synchronize()
    t0 = time.perf_counter()
    for i in range(n):
        rt.launch(f, _kernel, a.t, b.t, name="add", **declared)
        if i % 16 == 15:  # keep the queues short, as an engine step does
            ev.record(f)
            s.wait_event(ev)
    rt.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


def bench_core(n_buffers: int, n: int) -> float:
    d = Detector()
    ctx = d.add_context("s")
    for i in range(n_buffers):
        d.alloc(i, f"b{i}")
    op = OpInfo("k", "bench:1")
    t0 = time.perf_counter()
    for i in range(n):
        clock = d.enqueue(ctx)
        d.access(ctx, i % 4, False, None, op, clock)
        d.access(ctx, (i + 1) % 4, True, None, op, clock)
    return (time.perf_counter() - t0) / (2 * n) * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--launches", type=int, default=4000)
    p.add_argument("--device", choices=["sim", "cuda", "all"], default="all")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(1)
    devices = ["sim", "cuda"] if args.device == "all" else [args.device]
    if "cuda" in devices and not torch.cuda.is_available():
        devices.remove("cuda")
    rows = []
    for dev in devices:  # warm-up: the first dispatch-mode entry imports torch machinery
        bench_launches(dev, True, "infer", 200)
    for dev in devices:
        off = bench_launches(dev, False, "infer", args.launches)
        for access in ("infer", "declared"):
            on = bench_launches(dev, True, access, args.launches)
            rows.append({"device": dev, "access": access, "us_per_launch_off": round(off, 2),
                         "us_per_launch_on": round(on, 2), "overhead_us": round(on - off, 2)})
    core = [{"tracked_buffers": nb, "us_per_access": round(bench_core(nb, 20000), 3)}
            for nb in (4, 1000, 100000)]
    if args.json:
        print(json.dumps({"launches": rows, "core": core}, indent=1))
        return
    print(f"{'device':6} {'access':9} {'off us/launch':>14} {'on us/launch':>13} {'overhead':>9}")
    for r in rows:
        print(f"{r['device']:6} {r['access']:9} {r['us_per_launch_off']:14.2f} "
              f"{r['us_per_launch_on']:13.2f} {r['overhead_us']:9.2f}")
    print()
    print(f"{'tracked buffers':>16} {'core us/access':>15}")
    for r in core:
        print(f"{r['tracked_buffers']:16d} {r['us_per_access']:15.3f}")


if __name__ == "__main__":
    main()
