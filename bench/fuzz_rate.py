"""Fuzz throughput: examples/s and engine steps/s with 1 and 2 processes.

    python bench/fuzz_rate.py [--seconds S] [--jobs 1,2] [--json]

Runs a time-boxed campaign on the sim with the oracle model and every checker on,
once per job count, and prints the rates side by side.
"""
from __future__ import annotations

import argparse
import json

from overlapcheck.fuzz.campaign import Options
from overlapcheck.fuzz.jobs import run_jobs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--jobs", default="1,2")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    rows = []
    for jobs in [int(x) for x in args.jobs.split(",") if x]:
        s = run_jobs(Options(seconds=args.seconds, seed=args.seed, out=None), jobs)
        rows.append({"jobs": jobs, "seconds": s["seconds"], "examples": s["examples"],
                     "steps": s["steps"],
                     "examples_per_s": round(s["examples"] / s["seconds"], 2),
                     "steps_per_s": round(s["steps"] / s["seconds"], 1),
                     "findings": len(s["findings"])})
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{'jobs':>4} {'seconds':>8} {'examples':>9} {'examples/s':>11} {'steps':>8} "
          f"{'steps/s':>8} {'findings':>9}")
    for r in rows:
        print(f"{r['jobs']:4d} {r['seconds']:8.1f} {r['examples']:9d} {r['examples_per_s']:11.2f} "
              f"{r['steps']:8d} {r['steps_per_s']:8.1f} {r['findings']:9d}")


if __name__ == "__main__":
    main()
