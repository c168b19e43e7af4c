"""Scale: a step's cost does not grow with the run, nor with the queue, the detector's not
with the pool, and a long run's memory stays bounded (docs/design.md §8). Prints figures;
asserts nothing.

    python bench/scale.py [--requests 10000] [--pool 128] [--gap 2]
                          [--pools 1024,102400] [--pool-requests 300] [--load 100000]
                          [--only soak,queue,pools,load] [--json FILE]

* soak: one checked run (every checker, parity's reference included, the fuzzer's eager
  schedule, no trace) of ``--requests`` requests arriving every ``--gap`` steps with random
  aborts, on a pool small enough to force retractions; steps/s (per CPU second) of its
  first and last 1,000 steps and their ratio; the process's RSS every 1,000 requests;
* queue: the same requests all arriving at step 0, so the waiting queue starts
  ``--requests`` long and drains over the run: the same first/last figures;
* pools: the same engine on pools of ``--pools`` slots with ``--pool-requests`` requests:
  CPU per step, and the detector's share of it (time inside the detector core);
* load: ``overlapcheck run --workload`` of a ``--load``-request file (written here, in
  YAML and in JSON): seconds until the workload is loaded and until the first progress
  line, and those lines.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time


def rss_mib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) // 1024
    return -1


class Probe:
    """A run log (``Monitor(log=...)``) that stamps each step's end and samples RSS."""

    def __init__(self, every: int):
        self.every, self.arrived = every, 0
        self.cpu, self.wall, self.rss = [], [], []

    def event(self, ev) -> None:
        from overlapcheck.protocol import events as E
        if type(ev) is E.StepEnd:
            self.cpu.append(time.process_time())
            self.wall.append(time.perf_counter())
        elif type(ev) is E.Arrived:
            self.arrived += 1
            if self.arrived % self.every == 0:
                self.rss.append((self.arrived, len(self.cpu), rss_mib()))

    def violation(self, v) -> None:
        pass

    def end(self, status, steps) -> None:
        pass


def workload(n: int, cfg, gap: int, seed: int = 1):
    """``generate``'s requests and aborts, one arrival every ``gap`` steps."""
    from overlapcheck.protocol import generate
    from overlapcheck.protocol.workload import AbortAt, Workload
    wl = generate(seed, n, cfg, max_prompt=16, max_new=24)
    at = {r.rid: gap * r.rid for r in wl.requests}
    reqs = tuple(dataclasses.replace(r, arrival=at[r.rid]) for r in wl.requests)
    aborts = tuple(AbortAt(a.rid, at[a.rid] + a.step - wl.requests[a.rid].arrival)
                   for a in wl.aborts)
    return Workload(reqs, aborts)


def at_once(wl):
    """``wl`` with every request arriving at step 0 (aborts at their steps)."""
    from overlapcheck.protocol.workload import Workload
    return Workload(tuple(dataclasses.replace(r, arrival=0) for r in wl.requests), wl.aborts)


def soak(n: int, pool: int, gap: int, queue: bool = False) -> dict:
    from overlapcheck.engine import EngineConfig
    from overlapcheck.run import Case, ScheduleSpec, execute
    cfg = EngineConfig(pool_tokens=pool, row_width=64, max_running=8)
    wl = workload(n, cfg, gap)
    if queue:
        wl = at_once(wl)
    probe = Probe(1000)
    rss0 = rss_mib()
    out = execute(Case(cfg, wl, ScheduleSpec("stalls")), log=probe, trace=False)
    cpu, steps = probe.cpu, len(probe.cpu)
    k = min(1000, steps // 2)
    first = k / (cpu[k] - cpu[0])
    last = k / (cpu[-1] - cpu[-1 - k])
    s = out.result.summary if out.result is not None else None
    return {"requests": n, "pool": pool, "gap": gap, "status": out.status, "steps": out.steps,
            "findings": [f.ident for f in out.findings],
            "aborted": getattr(s, "aborts", None), "retractions": getattr(s, "retractions", None),
            "first_steps_per_cpu_s": round(first, 1), "last_steps_per_cpu_s": round(last, 1),
            "last_over_first": round(last / first, 3), "window": k,
            "cpu_s": round(cpu[-1] - cpu[0], 2), "wall_s": round(probe.wall[-1] - probe.wall[0], 2),
            "rss_start_mib": rss0, "rss": probe.rss}


def pool_cost(pool: int, n: int) -> dict:
    from overlapcheck.engine import EngineConfig
    from overlapcheck.race import detector as D
    from overlapcheck.run import Case, ScheduleSpec, execute
    cfg = EngineConfig(pool_tokens=pool, row_width=64, max_running=8)
    wl = workload(n, cfg, 3, seed=2)
    spent = [0.0]
    originals = {name: fn for name, fn in vars(D.Detector).items()
                 if callable(fn) and not name.startswith("__")}

    def timed(fn):
        def run(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[0] += time.perf_counter() - t
        return run

    probe = Probe(10 ** 9)
    for name, fn in originals.items():
        setattr(D.Detector, name, timed(fn))
    try:
        out = execute(Case(cfg, wl, ScheduleSpec("stalls")), log=probe, trace=False)
    finally:
        for name, fn in originals.items():
            setattr(D.Detector, name, fn)
    steps = len(probe.cpu) - 1
    wall = probe.wall[-1] - probe.wall[0]
    return {"pool": pool, "steps": out.steps, "status": out.status,
            "cpu_ms_per_step": round(1e3 * (probe.cpu[-1] - probe.cpu[0]) / steps, 3),
            "detector_us_per_step": round(1e6 * spent[0] / out.steps, 1),
            "detector_share": round(spent[0] / wall, 3) if wall else None}


def load(n: int, seconds: float = 60.0) -> list:
    """``overlapcheck run --workload FILE`` of ``n`` requests (one every 2 steps), the file
    in YAML (block style, as PyYAML writes it) and in JSON: per form, the seconds until
    the run says it has loaded the workload and until its first progress line."""
    import os
    import subprocess
    import sys
    import tempfile
    import yaml
    from overlapcheck.engine import EngineConfig
    from overlapcheck.protocol.workload import dump
    doc = dump(workload(n, EngineConfig(), 2, seed=3))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for form in ("yaml", "json"):
            path = os.path.join(tmp, f"w.{form}")
            with open(path, "w") as fh:
                if form == "json":
                    json.dump(doc, fh)
                else:
                    yaml.dump(doc, fh, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper))
            t0 = time.monotonic()
            p = subprocess.Popen([sys.executable, "-m", "overlapcheck", "run", "--workload", path],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            loaded = first = None
            lines = []
            try:
                for line in p.stderr:
                    lines.append(line.rstrip())
                    if loaded is None and line.startswith(f"run: {n} requests"):
                        loaded = time.monotonic() - t0
                    if line.startswith("run: step"):
                        first = time.monotonic() - t0
                        break
                    if time.monotonic() - t0 > seconds:
                        break
            finally:
                p.kill()
                p.wait()
            rows.append({"requests": n, "form": form,
                         "file_mib": round(os.path.getsize(path) / 2 ** 20, 1),
                         "loaded_s": None if loaded is None else round(loaded, 1),
                         "first_progress_s": None if first is None else round(first, 1),
                         "lines": lines[:3]})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=10000)
    ap.add_argument("--pool", type=int, default=128, help="soak pool (slots): retractions")
    ap.add_argument("--gap", type=int, default=2, help="steps between arrivals")
    ap.add_argument("--pools", default="1024,102400")
    ap.add_argument("--pool-requests", type=int, default=300)
    ap.add_argument("--load", type=int, default=100000, help="requests of the load test")
    ap.add_argument("--only", default="soak,queue,pools,load",
                    help="which parts to run (default all)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    only = set(args.only.split(","))
    from overlapcheck.fuzz.jobs import tune_process
    tune_process("sim")
    doc = {}
    if "pools" in only:
        pools = doc["pools"] = [pool_cost(int(p), args.pool_requests)
                                for p in args.pools.split(",") if p]
        print("pool size: CPU per step and the detector's time per step (same workload)")
        for r in pools:
            print(f"  {r['pool']:>7} slots: {r['steps']} steps, {r['cpu_ms_per_step']:.3f} ms "
                  f"CPU/step, detector {r['detector_us_per_step']:.0f} us/step ({r['status']})")
    for part in ("soak", "queue"):
        if part not in only:
            continue
        s = doc[part] = soak(args.requests, args.pool, args.gap, queue=part == "queue")
        when = "all at step 0" if part == "queue" else f"one every {s['gap']} steps"
        print(f"{part}: {s['requests']} requests, pool {s['pool']} slots, {when}: "
              f"{s['status']}, {s['steps']} steps, {len(s['findings'])} finding(s), "
              f"{s['aborted']} aborted, {s['retractions']} retractions, {s['cpu_s']} s CPU, "
              f"{s['wall_s']} s wall")
        print(f"  steps/s per CPU second: first {s['window']} steps {s['first_steps_per_cpu_s']}, "
              f"last {s['window']} steps {s['last_steps_per_cpu_s']} (last/first "
              f"{s['last_over_first']}; CPU per step last/first "
              f"{round(1 / s['last_over_first'], 3)})")
        print(f"  RSS at start {s['rss_start_mib']} MiB; every 1000 requests (requests, step, "
              f"MiB):")
        for arrived, step, mib in s["rss"]:
            print(f"    {arrived:>6} {step:>7} {mib:>6}")
    if "load" in only:
        doc["load"] = load(args.load)
        for r in doc["load"]:
            print(f"load: run --workload of {r['requests']} requests, {r['file_mib']} MiB of "
                  f"{r['form'].upper()}: loaded after {r['loaded_s']} s (the command's start "
                  f"included), first progress line after {r['first_progress_s']} s")
            for line in r["lines"]:
                print(f"  {line}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(doc, fh, indent=1)


if __name__ == "__main__":
    main()
