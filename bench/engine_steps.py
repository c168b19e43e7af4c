"""Engine steps per second on the sim device, oracle model: race detector off, on with
declared accesses, and on with full access inference. Prints figures; asserts nothing.

    python bench/engine_steps.py [--requests N] [--seed S] [--repeat R]
"""
from __future__ import annotations

import argparse
import time

import torch

from fake_models import OracleModel
from overlapcheck.device import make_runtime
from overlapcheck.engine import Engine, EngineConfig
from overlapcheck.protocol import generate

MODES = (("detector off", False, "declared"), ("detector, declared", True, "declared"),
         ("detector, infer", True, "infer"))


def measure(cfg, wl, seed, detect, access, repeat):
    best = None
    for _ in range(repeat):
        rt = make_runtime("sim", seed=seed, strategy="random", detect=detect, access=access)
        eng = Engine(cfg, rt, OracleModel())
        t0 = time.perf_counter()
        res = eng.run(wl)
        dt = time.perf_counter() - t0
        if best is None or dt < best[0]:
            best = (dt, res.summary, len(rt.reports))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(1)
    warm = EngineConfig()
    for _, detect, access in MODES:   # one-time costs (imports, dispatch caches) out of the figures
        measure(warm, generate(args.seed, 2, warm), args.seed, detect, access, 1)
    for label, cfg in (("overlap + spec", EngineConfig()),
                       ("non-overlap + spec", EngineConfig(overlap=False)),
                       ("overlap, no spec", EngineConfig(spec=False))):
        wl = generate(args.seed, args.requests, cfg)
        for mode, detect, access in MODES:
            dt, s, races = measure(cfg, wl, args.seed, detect, access, args.repeat)
            print(f"{label:20s} {mode:20s} {s.steps / dt:8.1f} steps/s  {s.tokens / dt:8.1f} "
                  f"tokens/s  ({s.steps} steps, {s.batches} batches, {dt:.2f}s, races {races})")


if __name__ == "__main__":
    main()
