"""How well ``overlapcheck fuzz --time T`` keeps its box: the wall time of whole commands
(the interpreter's start to its exit, start-up, shrinking, writing and shutdown
included), over ``--runs`` runs per configuration. Prints figures; asserts nothing.

    python bench/timebox.py [--time 5] [--runs 20] [--jobs 1,2] [--fault no-war-barrier]
                            [--json FILE]

For each job count, with and without ``--fault`` (a fault gives findings to write and
shrink): per run the wall seconds, the start-up the campaign reports (the command's
start to its campaign's), the examples and findings; then the median, the 95th
percentile and the largest wall time, and how many runs ended past T + 1 s. The runs of
the configurations alternate, so a slow period of the machine falls on all of them.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def one(seconds: float, jobs: int, fault, seed: int) -> dict:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "overlapcheck", "fuzz", "--time", str(seconds), "-j",
               str(jobs), "--seed", str(seed), "--json", "--out", out]
        if fault:
            cmd += ["--fault", fault]
        t0 = time.monotonic()
        p = subprocess.run(cmd, capture_output=True, text=True, env=env)
        wall = time.monotonic() - t0
    try:
        s = json.loads(p.stdout)
    except ValueError:
        s = {}
    return {"wall": round(wall, 2), "exit": p.returncode,
            "start_up": s.get("start_up_seconds"), "examples": s.get("examples"),
            "findings": len(s.get("findings", ())), "killed": s.get("killed", [])}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time", type=float, default=5.0, help="the box T (default 5 s)")
    ap.add_argument("--runs", type=int, default=20, help="runs per configuration (default 20)")
    ap.add_argument("--jobs", default="1,2", help="job counts (default 1,2)")
    ap.add_argument("--fault", default="no-war-barrier",
                    help="a fault for the runs with findings ('' for none)")
    ap.add_argument("--json", default=None, help="also write the runs as JSON")
    args = ap.parse_args(argv)
    configs = [(int(j), f) for j in args.jobs.split(",") if j
               for f in ([None, args.fault] if args.fault else [None])]
    runs = {c: [] for c in configs}
    for k in range(args.runs):
        for c in configs:
            runs[c].append(one(args.time, c[0], c[1], seed=k))
            r = runs[c][-1]
            print(f"  run {k + 1:2d} -j {c[0]} {c[1] or 'clean':>14}: {r['wall']:6.2f} s wall "
                  f"(start-up {r['start_up']} s, {r['examples']} examples, {r['findings']} "
                  f"findings, exit {r['exit']})", file=sys.stderr, flush=True)
    limit = args.time + 1.0
    print(f"fuzz --time {args.time:g}: wall seconds of the whole command over {args.runs} runs "
          f"(limit T + 1 = {limit:g} s)")
    print(f"{'jobs':>4} {'fault':>16} {'median':>7} {'p95':>7} {'max':>7} {'over T+1':>9} "
          f"{'start-up med':>13} {'examples med':>13}")
    for (jobs, fault), rs in runs.items():
        walls = sorted(r["wall"] for r in rs)
        p95 = walls[min(len(walls) - 1, int(round(0.95 * (len(walls) - 1))))]
        over = sum(w > limit for w in walls)
        ups = [r["start_up"] for r in rs if r["start_up"] is not None]
        exs = [r["examples"] for r in rs if r["examples"] is not None]
        print(f"{jobs:4d} {fault or 'none':>16} {statistics.median(walls):7.2f} {p95:7.2f} "
              f"{walls[-1]:7.2f} {over:>5d}/{len(walls):<3d} "
              f"{statistics.median(ups) if ups else float('nan'):13.2f} "
              f"{statistics.median(exs) if exs else 0:13.0f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"time": args.time, "runs": {f"{j}:{f or ''}": rs
                                                   for (j, f), rs in runs.items()}}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
