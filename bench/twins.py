"""What the sim's host twins buy, and what checking them costs: the fuzzer's own cases
(drawn as a campaign draws them) run with the twins (``run``, the default), with the
torch kernels only (``off``), and with every twin launch checked against its kernel
(``check``, an eighth of a campaign's examples). Prints examples per second and the
ratios, then per kernel the seconds its launches took with the twin and without, and
the share of the plain run's time the twin saves; asserts nothing. A twin stays only
while the twins buy at least 20% of campaign throughput (docs/design.md §3.4, "Twins
held to their kernels").

    python bench/twins.py [--cases N] [--repeat R]
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import time

import torch
from hypothesis import HealthCheck, Phase, given, settings

from overlapcheck.device import api
from overlapcheck.fuzz.strategies import cases
from overlapcheck.run import execute

MODES = ("run", "off", "check")


def draw(n: int):
    got = []

    @settings(max_examples=n, phases=(Phase.generate,), database=None, deadline=None,
              suppress_health_check=list(HealthCheck), derandomize=True)
    @given(cases())
    def prop(case):
        got.append(dataclasses.replace(case, audit=False, twins="run"))

    prop()
    return got


def measure(drawn, twins: str) -> float:
    t0 = time.perf_counter()
    for case in drawn:
        execute(dataclasses.replace(case, twins=twins))
    return time.perf_counter() - t0


def per_kernel(drawn, twins: str) -> dict:
    """Seconds spent in each twinned kernel's launches (twin or kernel, as ``twins``
    runs them), by kernel name."""
    spent = collections.Counter()
    real = api.Runtime._call

    def timed(self, fn, args, kwargs):
        if getattr(fn, "host_twin", None) is None:
            return real(self, fn, args, kwargs)
        t0 = time.perf_counter()
        try:
            return real(self, fn, args, kwargs)
        finally:
            spent[fn.__name__] += time.perf_counter() - t0

    api.Runtime._call = timed
    try:
        measure(drawn, twins)
    finally:
        api.Runtime._call = real
    return spent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=40)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(1)
    drawn = draw(args.cases)
    measure(drawn[:3], "off")       # one-time costs (imports, dispatch caches) out of the figures
    best = {m: min(measure(drawn, m) for _ in range(args.repeat)) for m in MODES}
    for m in MODES:
        print(f"twins {m:6s} {len(drawn) / best[m]:7.2f} examples/s  ({best[m]:.1f}s for "
              f"{len(drawn)} cases)")
    print(f"the twins buy {best['off'] / best['run'] - 1:+.0%} of throughput over the "
          f"kernels alone; a checked example costs {best['check'] / best['run']:.2f}x a "
          f"plain one; a campaign checking an eighth runs at "
          f"{1 / (7 / 8 + best['check'] / best['run'] / 8):.0%} of the unchecked rate")
    twin, kernel = per_kernel(drawn, "run"), per_kernel(drawn, "off")
    print(f"\n{'kernel':22s} {'twin s':>8s} {'kernel s':>9s} {'saves':>7s}  (of the plain run)")
    for name in sorted(kernel, key=lambda n: twin.get(n, 0) - kernel[n]):
        print(f"{name:22s} {twin.get(name, 0):8.2f} {kernel[name]:9.2f} "
              f"{(kernel[name] - twin.get(name, 0)) / best['run']:7.1%}")


if __name__ == "__main__":
    main()
