"""What the sim's host runs buy, what each kept twin would buy over its kernel's one
source, and what checking them costs: the fuzzer's own cases (drawn as a campaign draws
them) run four ways:

* ``run``: the default: each kernel's one source on numpy views, or its twin where it
  keeps one (``device/xp.TWINNED``; none does today);
* ``source``: every kernel's one source on numpy, no twin;
* ``off``: the kernels on torch tensors only (as on a GPU, on the CPU);
* ``check``: every host run checked against the kernel on torch (an eighth of a
  campaign's examples).

Prints examples per second and the ratios, then per kernel the seconds its launches
took each way and the share of the plain run's time the host run saves over torch;
for each kept twin, the share it saves over its one source. Asserts nothing. A twin
stays only where that share is at least 20% (docs/design.md §3.4, "One source per
kernel").

    python bench/twins.py [--cases N] [--repeat R]
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import time

import torch
from hypothesis import HealthCheck, Phase, given, settings

from overlapcheck.device import api
from overlapcheck.device import xp
from overlapcheck.fuzz.strategies import cases
from overlapcheck.run import execute

MODES = ("run", "source", "off", "check")


def draw(n: int):
    got = []

    @settings(max_examples=n, phases=(Phase.generate,), database=None, deadline=None,
              suppress_health_check=list(HealthCheck), derandomize=True)
    @given(cases())
    def prop(case):
        got.append(dataclasses.replace(case, audit=False, twins="run"))

    prop()
    return got


@contextlib.contextmanager
def one_source_only():
    """Every kept twin set aside: its kernel's one source runs on numpy instead."""
    kept = {k: k.host_run for k in xp.TWINNED}
    for k in kept:
        k.host_run = k
    try:
        yield
    finally:
        for k, twin in kept.items():
            k.host_run = twin


def measure(drawn, mode: str) -> float:
    twins = "run" if mode == "source" else mode
    with one_source_only() if mode == "source" else contextlib.nullcontext():
        t0 = time.perf_counter()
        for case in drawn:
            execute(dataclasses.replace(case, twins=twins))
        return time.perf_counter() - t0


def per_kernel(drawn, mode: str) -> dict:
    """Seconds spent in each host-run kernel's launches (as ``mode`` runs them), by
    kernel name."""
    spent = collections.Counter()
    real = api.Runtime._call

    def timed(self, fn, args, kwargs):
        if getattr(fn, "host_run", None) is None:
            return real(self, fn, args, kwargs)
        t0 = time.perf_counter()
        try:
            return real(self, fn, args, kwargs)
        finally:
            spent[fn.__name__] += time.perf_counter() - t0

    api.Runtime._call = timed
    try:
        measure(drawn, mode)
    finally:
        api.Runtime._call = real
    return spent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=40)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    if args.cases < 1 or args.repeat < 1:
        ap.error("--cases and --repeat must be at least 1")
    torch.set_num_threads(1)
    drawn = draw(args.cases)
    measure(drawn[:3], "off")       # one-time costs (imports, dispatch caches) out of the figures
    best = {m: min(measure(drawn, m) for _ in range(args.repeat)) for m in MODES}
    for m in MODES:
        print(f"{m:6s} {len(drawn) / best[m]:7.2f} examples/s  ({best[m]:.1f}s for "
              f"{len(drawn)} cases)")
    print(f"the host runs buy {best['off'] / best['run'] - 1:+.0%} of throughput over the "
          f"kernels on torch; the kept twins {best['source'] / best['run'] - 1:+.0%} over "
          f"their one source; a checked example costs {best['check'] / best['run']:.2f}x a "
          f"plain one; a campaign checking an eighth runs at "
          f"{1 / (7 / 8 + best['check'] / best['run'] / 8):.0%} of the unchecked rate")
    run, source, off = (per_kernel(drawn, m) for m in ("run", "source", "off"))
    print(f"\n{'kernel':22s} {'host s':>8s} {'torch s':>8s} {'saves':>7s}  (of the plain run)")
    for name in sorted(off, key=lambda n: run.get(n, 0) - off[n]):
        print(f"{name:22s} {run.get(name, 0):8.2f} {off[name]:8.2f} "
              f"{(off[name] - run.get(name, 0)) / best['run']:7.1%}")
    print(f"\n{'kept twin':22s} {'twin s':>8s} {'source s':>8s} {'saves':>7s}  (of the plain run)")
    if not xp.TWINNED:
        print("(none: every kernel runs its one source)")
    for k in xp.TWINNED:
        name = k.__name__
        print(f"{name:22s} {run.get(name, 0):8.2f} {source.get(name, 0):8.2f} "
              f"{(source.get(name, 0) - run.get(name, 0)) / best['run']:7.1%}")


if __name__ == "__main__":
    main()
