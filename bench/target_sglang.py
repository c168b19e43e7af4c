"""SGLang target step rate on one core: SGLang 0.5.23's real scheduler driven one host
step at a time, overlap loop and normal loop, with the fake model worker (with and
without spec decode) or, with ``--worker eagle-v2``, SGLang's own spec-v2 worker on the
tiny pair. Prints figures; asserts nothing.

Per mode, on the same seeded workload (no aborts):

* ``unchecked``: the session alone (no observer): SGLang's own step plus the target's
  reading of its state;
* ``checked``: ``overlapcheck.run.execute`` with every checker that reads SGLang's
  events (kv-accounting, parity, metrics, lifecycle, liveness, sglang-golden),
  parity's reference run (the normal loop) precomputed, as a campaign's shrink steps
  would not; ``checked+ref`` also runs that reference inside the timing (what one
  fuzz example costs). Steps are the run's host steps; the reference's are not counted.

With the real worker every checked run is also watched (the race detector on SGLang's
CUDA path, docs/targets.md); ``unchecked`` is then the session with the detector off,
and ``watched`` the session with it on and no checker.

The first build of a process (SGLang's import, then the scheduler) is timed apart.

    python bench/target_sglang.py [--worker fake|eagle-v2] [--requests N] [--seed S]
                                  [--repeat R]
"""
from __future__ import annotations

import argparse
import time
from dataclasses import replace


def _best(fn, repeat: int):
    """(seconds, steps) of the fastest of ``repeat`` calls of ``fn``."""
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        steps = fn()
        out.append((time.perf_counter() - t0, steps))
    return min(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--worker", default="fake", choices=("fake", "eagle-v2"),
                    help="the spec worker (default fake; eagle-v2: SGLang's own)")
    args = ap.parse_args()
    import torch
    torch.set_num_threads(1)

    from overlapcheck.device.sched import Eager
    from overlapcheck.protocol.workload import Workload
    from overlapcheck.run import Case, ScheduleSpec, execute, reference_run
    from overlapcheck.targets.sglang import SglangConfig, SglangTarget

    from overlapcheck.targets.sglang.config import from_dict
    target = SglangTarget()
    t0 = time.perf_counter()
    real = args.worker != "fake"
    warm = from_dict({"worker": args.worker, "vocab": 32, "context": 64}) if real else SglangConfig()
    s = target.open(warm, Eager(), None)
    s.run(target.generate(args.seed, 1, warm))
    s.close()
    print(f"SGLang {target.version()}: first build of the process (import + scheduler) "
          f"{time.perf_counter() - t0:.1f} s")

    def session_only(cfg, wl, detect=False):
        session = target.open(cfg, Eager(), None, detect=detect)
        try:
            session.run(wl)
        finally:
            session.close()
        return session.iteration

    watched = "watched/s" if real else ""
    head = (f"{'mode':<22} {'steps':>6} {'unchecked/s':>12} {watched:>10} {'checked/s':>10} "
            f"{'checked+ref/s':>14} {'ratio':>6}")
    print(head)
    print("-" * len(head))
    if real:
        base = dict(worker=args.worker, vocab=32, context=64)
        modes = (("overlap, spec 2", from_dict(dict(base, spec_steps=2))),
                 ("normal, spec 2", from_dict(dict(base, spec_steps=2, overlap=False))),
                 ("overlap, spec 4", from_dict(dict(base, spec_steps=4))))
    else:
        modes = (("overlap, no spec", SglangConfig()),
                 ("normal, no spec", SglangConfig(overlap=False)),
                 ("overlap, spec 2", SglangConfig(spec_steps=2)),
                 ("normal, spec 2", SglangConfig(spec_steps=2, overlap=False)))
    for label, cfg in modes:
        wl = target.generate(args.seed, args.requests, cfg)
        wl = Workload(wl.requests, ())
        case = Case(cfg, wl, ScheduleSpec("stalls", 0, ()), (), (), "sglang")
        session_only(cfg, wl)                                  # builds both configs
        ref = reference_run(case)
        session_only(replace(cfg, overlap=False), wl)
        plain_t, steps = _best(lambda: session_only(cfg, wl), args.repeat)
        watched = ""
        if real:
            watch_t, _ = _best(lambda: session_only(cfg, wl, detect=True), args.repeat)
            watched = f"{steps / watch_t:.1f}"
        checked_t, _ = _best(lambda: execute(case, reference=ref, trace=False).steps,
                             args.repeat)
        full_t, _ = _best(lambda: execute(case, trace=False).steps, args.repeat)
        fmt = ".1f" if real else ".0f"
        print(f"{label:<22} {steps:>6} {steps / plain_t:>12{fmt}} {watched:>10} "
              f"{steps / checked_t:>10{fmt}} {steps / full_t:>14{fmt}} {plain_t / checked_t:>6.2f}")


if __name__ == "__main__":
    main()
