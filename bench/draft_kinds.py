"""Engine steps per second on the sim device, per draft kind (standalone, eagle, mtp)
and model (oracle, tiny), overlap and spec on, race detector on with declared
accesses; also the mean accept length. Prints figures; asserts nothing.

    python bench/draft_kinds.py [--requests N] [--seed S] [--repeat R] [--models oracle,tiny]
"""
from __future__ import annotations

import argparse
import time

import torch

from fake_models import make_model
from overlapcheck.device import make_runtime
from overlapcheck.engine import Engine, EngineConfig
from overlapcheck.engine.drafts import DRAFT_KINDS
from overlapcheck.protocol import generate

KINDS = tuple(DRAFT_KINDS)


def measure(cfg, wl, seed, repeat):
    best = None
    for _ in range(repeat):
        rt = make_runtime("sim", seed=seed, strategy="random", detect=True, access="declared")
        eng = Engine(cfg, rt, make_model(cfg.model))
        t0 = time.perf_counter()
        res = eng.run(wl)
        dt = time.perf_counter() - t0
        if best is None or dt < best[0]:
            best = (dt, res.summary)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--models", default="oracle,tiny")
    args = ap.parse_args()
    torch.set_num_threads(1)
    for model in args.models.split(","):
        for kind in KINDS:
            cfg = EngineConfig(draft_kind=kind, model=model)
            measure(cfg, generate(args.seed, 2, cfg), args.seed, 1)   # warm-up
            wl = generate(args.seed, args.requests, cfg)
            dt, s = measure(cfg, wl, args.seed, args.repeat)
            print(f"{model:7s} {kind:11s} {s.steps / dt:8.1f} steps/s {s.tokens / dt:8.1f} tokens/s"
                  f"  mean accept {s.mean_accept_length:.2f}  ({s.steps} steps, {dt:.2f}s)")


if __name__ == "__main__":
    main()
