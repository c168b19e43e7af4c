"""Checker cost on the sim, oracle model: engine steps per second unchecked (no
observer) and checked (all checkers with the target's context, parity reference
precomputed, a fresh golden reference per run), their ratio, and the time each checker
spends per step. Prints figures; asserts nothing.

    python bench/checkers.py [--requests N] [--seed S] [--repeat R]
"""
from __future__ import annotations

import argparse
import time

import torch

from fake_models import OracleModel
from fake_models.golden import Golden
from invariants import make_checkers
from overlapcheck import targets
from overlapcheck.device import make_runtime
from overlapcheck.engine import Engine, EngineConfig
from overlapcheck.protocol import generate
from overlapcheck.run import Case, Monitor, reference_run


class Timed:
    """Wraps a checker and adds up the time its handlers take."""

    def __init__(self, checker):
        self.c, self.name, self.fatal, self.spent = checker, checker.name, checker.fatal, 0.0
        self.idle = checker.idle        # the Monitor feeds an idle checker nothing

    def feed(self, ev):
        t0 = time.perf_counter()
        out = self.c.feed(ev)
        self.spent += time.perf_counter() - t0
        return out

    def finish(self):
        return self.c.finish()


def run(cfg, wl, seed, observer):
    rt = make_runtime("sim", seed=seed, strategy="random", access="declared")
    eng = Engine(cfg, rt, OracleModel(), observer)
    t0 = time.perf_counter()
    eng.run(wl)
    return time.perf_counter() - t0, eng.iteration


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    for label, cfg in (("overlap + spec", EngineConfig()),
                       ("overlap, no spec", EngineConfig(spec=False))):
        wl = generate(args.seed, args.requests, cfg)
        ref = reference_run(Case(cfg, wl))
        run(cfg, generate(args.seed, 2, cfg), args.seed, None)          # warm-up
        plain = min(run(cfg, wl, args.seed, None) for _ in range(args.repeat))
        best, timed = None, None
        for _ in range(args.repeat):
            # the target's checker context, with a golden reference that has seen nothing
            # yet (its cache would otherwise make the repeats cheaper than a first run)
            ctx = {**targets.get("reference").checker_context(cfg),
                   "model_golden": Golden(cfg.model, cfg.row_width)}
            ts = [Timed(c) for c in make_checkers(reference=ref, **ctx)]
            mon = Monitor(ts)
            got = run(cfg, wl, args.seed, mon)
            assert not mon.finish(), "a clean run reported violations"
            if best is None or got[0] < best[0]:
                best, timed = got, ts
        steps = plain[1]
        r0, r1 = steps / plain[0], best[1] / best[0]
        print(f"{label}: unchecked {r0:7.1f} steps/s, checked {r1:7.1f} steps/s, "
              f"checked/unchecked {r1 / r0:.3f} ({steps} steps)")
        for t in sorted(timed, key=lambda t: -t.spent):
            print(f"    {t.name:15s} {1e6 * t.spent / best[1]:8.1f} us/step")
        other = best[0] - plain[0] - sum(t.spent for t in timed)
        print(f"    {'(snapshots, events, canary)':15s} {1e6 * other / best[1]:8.1f} us/step")


if __name__ == "__main__":
    main()
