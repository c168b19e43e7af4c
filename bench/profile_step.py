"""Where a checked engine step's time goes, in the main job's mix (docs/design.md §8).

    python bench/profile_step.py [--examples N] [--seed S] [--by-kernel] [--json FILE]

Runs the main job — a fuzz campaign of the reference engine on the sim, oracle model,
every default checker — for a fixed number of examples (the same examples on every
tree: ``--seed`` and ``--examples`` fix them), with timers around the layers, and
prints, per layer, the time it took (exclusive: time in a nested layer counts for the
nested one), in microseconds per checked engine step and as a share of the campaign:

* fuzzer: Hypothesis (drawing cases, its engine, shrinking bookkeeping) and the campaign;
* driver: ``execute`` and ``Monitor`` plumbing (building checkers, outcomes, digests);
* setup: building runtime, model and engine for a run (buffers, streams, drafters);
* engine host: scheduler, memory, result processing, staging, events (the engine's
  Python); snapshot: the per-step ``Snapshot``;
* runtime: the device runtime's public calls and the sim's choice points and retires;
* closures: the device work itself (kernels, model, canary; ``--by-kernel`` splits it);
* detector: the happens-before core; detector feed: declarations turned into accesses;
* each checker; parity reference: the non-overlap reference run each example needs
  (its steps are not counted as checked steps; a campaign runs it once per reference
  config and workload, ``run.References``).

Timers cost about a microsecond per call, so the layers add up to a bit more than an
uninstrumented run; the run is repeated without timers to print the real rate too.
"""
from __future__ import annotations

import argparse
import functools
import json
import re
import time
from collections import defaultdict

_now = time.perf_counter


class Timers:
    """Exclusive time per category, from a stack of wrapped calls."""

    def __init__(self):
        self.spent = defaultdict(float)
        self.calls = defaultdict(int)
        self.stack = [["(outside)", _now()]]
        self.prefix = ""

    def enter(self, cat: str) -> None:
        t = _now()
        top = self.stack[-1]
        self.spent[top[0]] += t - top[1]
        self.stack.append([self.prefix + cat, t])
        self.calls[self.prefix + cat] += 1

    def leave(self) -> None:
        t = _now()
        cat, t0 = self.stack.pop()
        self.spent[cat] += t - t0
        self.stack[-1][1] = t

    def wrap(self, owner, attr: str, cat, prefix: str = None) -> None:
        """Time ``owner.attr`` as ``cat`` (a string, or a function of the call's
        arguments); ``prefix`` marks everything nested inside."""
        fn = getattr(owner, attr, None)
        if fn is None:
            return
        static = isinstance(vars(owner).get(attr), staticmethod)
        timers = self

        @functools.wraps(fn)
        def timed(*a, **k):
            old = timers.prefix
            if prefix is not None:
                timers.prefix = prefix
            timers.enter(cat if isinstance(cat, str) else cat(*a, **k))
            try:
                return fn(*a, **k)
            finally:
                timers.leave()
                timers.prefix = old
        setattr(owner, attr, staticmethod(timed) if static else timed)


def _kernel(self, fn, args, kwargs, declared, ctx, clock, op, *rest, **kw):
    return "closure " + re.sub(r"^next_|\d+$", "", op.name)


def _fn_kernel(self, fn, args, kwargs):
    return "closure " + re.sub(r"^next_|\d+$", "", getattr(fn, "__name__", "kernel"))


def install(t: Timers, by_kernel: bool) -> None:
    from invariants.base import Checker
    from overlapcheck.device import api, sim
    from overlapcheck.engine import loop, scheduler, worker
    from overlapcheck.engine import target as reference
    from overlapcheck.fuzz import campaign
    from overlapcheck.race import detector
    from overlapcheck.run import driver, monitor

    t.wrap(campaign.Campaign, "run", "fuzzer (Hypothesis, campaign)")
    t.wrap(campaign, "execute", "driver (execute, outcome)")
    t.wrap(driver, "reference_run", "parity reference run", prefix="ref: ")
    t.wrap(driver, "make_checkers", "driver (execute, outcome)")
    t.wrap(monitor.Monitor, "__call__", "monitor (event dispatch)")
    t.wrap(reference.ReferenceTarget, "open", "setup (runtime, model, engine)")
    for name in ("run", "step", "begin_step", "end_step"):
        t.wrap(loop.Engine, name, "engine host")
    t.wrap(loop.Engine, "snapshot", "snapshot")
    t.wrap(scheduler.Scheduler, "build", "engine host")
    t.wrap(worker.SpecWorker, "_stage", "engine host: staging")
    for name in ("launch", "copy", "_record", "_wait_event", "_query", "_sync_event",
                 "_sync_stream", "synchronize", "record_stream", "transfer", "host_view", "host_list",
                 "host_write", "to_host", "empty", "free", "host_empty", "_point"):
        for cls in (api.Runtime, sim.SimRuntime, sim.StraightRuntime):
            if name in vars(cls):
                t.wrap(cls, name, "runtime (calls, choice points, retire)")
    t.wrap(api.Runtime, "_run_closure", _kernel if by_kernel else "closures (kernels, model)")
    # the straight runtime (parity's reference run) runs a closure without _run_closure
    t.wrap(sim.StraightRuntime, "_call", _fn_kernel if by_kernel else "closures (kernels, model)")
    for name in ("_feed", "_declared", "_host_access", "_check_declared"):
        t.wrap(api.Runtime, name, "detector feed (declarations)")
    for name, fn in vars(detector.Detector).items():
        if callable(fn) and not name.startswith("__"):
            t.wrap(detector.Detector, name, "detector (happens-before)")
    t.wrap(Checker, "feed", lambda self, ev: f"checker {self.name}")
    t.wrap(Checker, "finish", lambda self: f"checker {self.name}")
    from invariants.base import REGISTRY, checker_class
    for name in REGISTRY:       # the Monitor calls handlers directly
        try:
            cls = checker_class(name)
        except Exception:  # noqa: BLE001 - a target's checker whose engine is missing
            continue
        for attr in list(vars(cls)):
            if attr.startswith("on_") or attr == "finish":
                t.wrap(cls, attr, f"checker {name}")


def campaign(examples: int, seed: int):
    from overlapcheck.fuzz.campaign import Campaign, Options
    c = Campaign(Options(seconds=None, examples=examples, seed=seed, out=None))
    t0, c0 = time.perf_counter(), time.process_time()
    c.run()
    return c, time.perf_counter() - t0, time.process_time() - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--examples", type=int, default=150)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--by-kernel", action="store_true", help="one line per kernel")
    ap.add_argument("--json", default=None, help="also write the figures here")
    ap.add_argument("--rate-only", action="store_true",
                    help="only the uninstrumented rate (wall and CPU)")
    args = ap.parse_args()
    campaign(3, args.seed + 1)         # imports and first-call costs out of the figures
    try:                               # the settings of the fuzz command's processes
        from overlapcheck.fuzz.jobs import tune_process
        tune_process("sim")
    except ImportError:                # a tree from before them
        import torch
        torch.set_num_threads(1)
    plain, wall, cpu = campaign(args.examples, args.seed)
    steps = plain.stats.steps
    print(f"uninstrumented: {args.examples} examples, {steps} checked steps in {wall:.2f} s "
          f"wall, {cpu:.2f} s CPU: {steps / wall:.0f} steps/s wall, {steps / cpu:.0f} "
          f"steps/s CPU")
    if args.rate_only:
        return
    timers = Timers()
    install(timers, args.by_kernel)
    timed, twall, _ = campaign(args.examples, args.seed)

    assert timed.stats.steps == steps, "the instrumented campaign ran other examples"
    total = sum(timers.spent.values()) - timers.spent.get("(outside)", 0.0)
    rows = sorted(((k, v) for k, v in timers.spent.items() if k != "(outside)"),
                  key=lambda kv: (kv[0].startswith("ref: "), -kv[1]))
    print(f"instrumented:   {twall:.2f} s ({steps / twall:.0f} steps/s); per checked step "
          f"{1e6 * total / steps:.0f} us")
    print(f"{'layer':44s} {'us/step':>8s} {'share':>6s} {'calls/step':>10s}")
    out = {}
    for k, v in rows:
        per = 1e6 * v / steps
        print(f"{k:44s} {per:8.1f} {100 * v / total:5.1f}% {timers.calls[k] / steps:10.1f}")
        out[k] = {"us_per_step": round(per, 2), "share": round(v / total, 4),
                  "calls_per_step": round(timers.calls[k] / steps, 2)}
    ref = sum(v for k, v in timers.spent.items() if k.startswith("ref: ")
              or k == "parity reference run")
    print(f"{'(parity reference run, all layers)':44s} {1e6 * ref / steps:8.1f} "
          f"{100 * ref / total:5.1f}%")
    runs = timers.calls.get("ref: parity reference run", 0)
    print(f"parity reference runs: {runs} for {args.examples} examples (a campaign keeps "
          f"those it ran: run.References)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"examples": args.examples, "steps": steps, "wall_s": wall, "cpu_s": cpu,
                       "layers": out}, fh, indent=1)


if __name__ == "__main__":
    main()
