"""Fleet throughput: one campaign (a fixed seed and example budget) run as 2 local
processes (``fuzz -j 2``) and as 2 slices on a local Ray cluster of 2 worker processes
(``fuzz --ray``); the finding sets must be equal, and the table gives each run's
throughput and the Ray run's over the pool's.

The cluster is started once, before the timed runs, as a fleet's cluster would already
be up; its start is printed apart (and the ratio with it counted in). One short untimed
run of each warms both up as a fleet's would be (the pool's fork server with the
campaign's modules imported, Ray's workers with the same); each timed run still starts
its workers' campaigns (forked processes, Ray tasks and the collector actor). Runs
alternate (pool, Ray, pool, Ray, ...) so that load from elsewhere on the machine falls
on both alike; the medians are compared. Engine steps per second is the measure of work
done: after a Hypothesis run's first failure, how many more examples it draws depends on
time (it stops looking 10 s after the first bug), so the two may run other cases then.

    python bench/fleet.py                       # 200 examples, seed 11, one fault on
    python bench/fleet.py --examples 400 --repeat 3 --fault none
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time

from overlapcheck.fuzz.ray_jobs import SINGLE_MACHINE


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--examples", type=int, default=200)
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--fault", default="lagged-verify-counted",
                   help="a bug-zoo fault to turn on (none: the clean engine)")
    p.add_argument("--repeat", type=int, default=3, help="timed runs of each (default 3)")
    a = p.parse_args(argv)
    os.environ.setdefault(SINGLE_MACHINE, "0")      # the cluster on loopback only
    from overlapcheck.fuzz.campaign import Options
    from overlapcheck.fuzz.workers import run_jobs
    from overlapcheck.fuzz.ray_jobs import connect, run_ray
    opts = Options(seconds=None, examples=a.examples, seed=a.seed,
                   faults=() if a.fault == "none" else (a.fault,))
    t0 = time.monotonic()
    connect("local:2")
    cluster_s = time.monotonic() - t0
    warm = dataclasses.replace(opts, examples=8)
    run_jobs(warm, 2)
    run_ray(warm, "local:2", 2)
    runs = {"pool (-j 2)": [], "ray (local:2)": []}
    for _ in range(a.repeat):
        runs["pool (-j 2)"].append(run_jobs(opts, 2))
        runs["ray (local:2)"].append(run_ray(opts, "local:2", 2))
    import ray
    ray.shutdown()

    print(f"campaign: {a.examples} examples, seed {a.seed}, fault {a.fault}; {a.repeat} "
          f"timed run(s) each after a warm-up; Ray cluster start {cluster_s:.1f} s (not in "
          f"the runs)")
    print(f"{'mode':16s} {'wall s':>8s} {'examples':>9s} {'steps':>7s} {'examples/s':>11s} "
          f"{'steps/s':>8s}  findings")
    med = {}
    for mode, summaries in runs.items():
        for s in summaries:
            print(f"{mode:16s} {s['seconds']:8.1f} {s['examples']:9d} {s['steps']:7d} "
                  f"{s['examples'] / s['seconds']:11.2f} {s['steps_per_second']:8.1f}  "
                  f"{sorted(f['id'] for f in s['findings'])}")
        med[mode] = (statistics.median(s["seconds"] for s in summaries),
                     statistics.median(s["steps_per_second"] for s in summaries),
                     statistics.median(s["examples"] / s["seconds"] for s in summaries))
    ids = {mode: [sorted(f["id"] for f in s["findings"]) for s in summaries]
           for mode, summaries in runs.items()}
    same = all(x == ids["pool (-j 2)"][0] for v in ids.values() for x in v)
    (pw, ps, pe), (rw, rs, re_) = med["pool (-j 2)"], med["ray (local:2)"]
    print(f"same finding set: {'yes' if same else 'NO'}")
    print(f"Ray / pool, medians: examples/s {re_ / pe:.2f}, steps/s {rs / ps:.2f}; "
          f"with the cluster's start counted in: examples/s "
          f"{(a.examples / (rw + cluster_s)) / pe:.2f}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
