"""Fuzz throughput: examples/s and engine steps/s with 1, 2, ... processes, and how far
N processes are from N times one.

    python bench/fuzz_rate.py [--seconds S] [--jobs 1,2,4,8,16] [--rounds R] [--seed S] [--json]

Runs a time-boxed campaign on the sim with the oracle model and every checker on, once
per job count (``overlapcheck fuzz --jobs N``) in each of ``--rounds`` rounds, and prints
per count the wall-clock rate (start-up of the worker processes included), the rate per
CPU second of the campaigns, and ``ratio`` = steps/s with N jobs / (N x steps/s with one
job): the goal is at least 0.8 on a machine with N free cores. One job runs in this
process, as ``overlapcheck fuzz`` runs it. The workers' fork server is started first, as
``fuzz -j`` starts it before its own imports: one job's figure leaves this process's
imports out, N jobs' the server's (``--cold-server``: started when the first N-job run
needs it, its imports inside that run's time).

A shared host's speed moves by tens of percent within minutes (one GPU host's single
campaign read 465 to 853 steps/s across an hour), and one job's figure is the
denominator of every ratio. So each round runs every count once, the order alternating
(forward, backward, ...), a round's ratio divides by that round's one-job rate, and
each figure is the median over the rounds with the ratio's min-max beside it.

``--ceiling`` also measures what the machine itself gives N processes, the same ratio
for two kinds of plain Python work (no torch, no I/O, nothing shared), each timed in
one process and then in N side by side: ``machine``, integer arithmetic on a small
dict, which stays in a core's own caches; ``32 MiB``, reads at random over a 32 MiB
array per process, which N processes share the last-level cache and memory for. Where
``machine`` is below 0.8 (all-core clocks under the one-core clock, neighbours' load),
no campaign reaches 0.8 there; ``of it`` = the campaign's ratio over ``machine``. A
campaign near ``32 MiB`` and far under ``machine`` loses to the shared caches: its
working set. Both are timed after the rounds: on a shared host they move with the
neighbours' load (one host read ``machine`` 0.61 to 1.02 for 16 processes, minutes
apart), so read them beside the campaign's ratio of the same run.
"""
from __future__ import annotations

import argparse
import array
import json
import multiprocessing
import os
import statistics
import time

from overlapcheck.fuzz.campaign import Options
from overlapcheck.fuzz.jobs import start_server
from overlapcheck.fuzz.workers import run_jobs


def _spin(seconds: float) -> float:
    """Rounds of plain interpreter work per second, for ``seconds``."""
    table: dict = {}
    rounds, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        acc = []
        for i in range(2000):
            k = (i * 7919) & 511
            table[k] = table.get(k, 0) + (i * i) % 13
            acc.append(k)
        rounds += 1
    return rounds / seconds


def _walk(seconds: float) -> float:
    """Reads per second at random over a 32 MiB array (4 Mi 8-byte cells), for ``seconds``."""
    cells = array.array("q", range(1 << 22))
    mask, i, reads, end = (1 << 22) - 1, 1, 0, time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(2000):
            i = (cells[i] * 1103515245 + 12345) & mask
        reads += 2000
    return reads / seconds


def ceiling(work, jobs: int, seconds: float) -> float:
    """The machine's ratio for ``work``: ``jobs`` processes of it side by side over
    ``jobs`` x one process alone (spawned, so nothing this process imported is shared)."""
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        one = pool.apply(work, (seconds,))
    with ctx.Pool(jobs) as pool:
        rates = pool.map(work, [seconds] * jobs, chunksize=1)
    return sum(rates) / (jobs * one)


def run_rounds(counts, seconds: float, seed: int, rounds: int) -> list:
    """Every job count once per round, the order alternating; per count a row of
    medians over the rounds, with each round's ratio to that round's one-job rate."""
    per = {jobs: [] for jobs in counts}
    for k in range(rounds):
        for jobs in (counts if k % 2 == 0 else counts[::-1]):
            s = run_jobs(Options(seconds=seconds, seed=seed, out=None), jobs)
            per[jobs].append(s)
    ones = [s["steps"] / s["seconds"] for s in per.get(1, ())]
    rows = []
    for jobs in counts:
        runs = per[jobs]
        rates = [s["steps"] / s["seconds"] for s in runs]
        cpu = [s["steps"] / s["cpu_seconds"] for s in runs if s.get("cpu_seconds")]
        # a round whose one-job campaign ran nothing (start-up took its box) has no ratio
        ratios = [r / (jobs * one) for r, one in zip(rates, ones) if one]
        med = statistics.median
        rows.append({"jobs": jobs, "rounds": len(runs),
                     "seconds": round(med(s["seconds"] for s in runs), 1),
                     "examples": round(med(s["examples"] for s in runs)),
                     "steps": round(med(s["steps"] for s in runs)),
                     "examples_per_s": round(med(s["examples"] / s["seconds"] for s in runs), 2),
                     "steps_per_s": round(med(rates), 1),
                     "steps_per_s_rounds": [round(r, 1) for r in rates],
                     "steps_per_cpu_s": round(med(cpu), 1) if cpu else None,
                     "findings": max(len(s["findings"]) for s in runs),
                     "ratio": round(med(ratios), 3) if ratios else None,
                     "ratio_min": round(min(ratios), 3) if ratios else None,
                     "ratio_max": round(max(ratios), 3) if ratios else None,
                     "ratio_rounds": [round(r, 3) for r in ratios]})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--seconds", type=float, default=20.0,
                   help="each campaign's time box (default 20)")
    p.add_argument("--jobs", default="1,2", help="job counts, comma-separated (default 1,2)")
    p.add_argument("--rounds", type=int, default=3,
                   help="runs of every job count, the order alternating (default 3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    p.add_argument("--cold-server", action="store_true",
                   help="start the workers' fork server inside the first N-job run")
    p.add_argument("--ceiling", action="store_true",
                   help="also the machine's own ratio for N processes of plain Python work")
    args = p.parse_args()
    try:
        counts = [int(x) for x in args.jobs.split(",") if x]
    except ValueError:
        p.error(f"--jobs: '{args.jobs}' is not a list of integers")
    if not counts or min(counts) < 1:
        p.error(f"--jobs: '{args.jobs}' needs counts of at least 1")
    if args.rounds < 1:
        p.error(f"--rounds: {args.rounds} is not a count of at least 1")
    if args.seconds <= 0:
        p.error(f"--seconds: {args.seconds} is not a positive time")
    if max(counts) > 1 and not args.cold_server:
        start_server()
    rows = run_rounds(counts, args.seconds, args.seed, args.rounds)
    for r in rows:
        if args.ceiling:
            for key, work in (("machine_ratio", _spin), ("machine_32mib_ratio", _walk)):
                r[key] = (round(ceiling(work, r["jobs"], min(args.seconds, 10.0)), 3)
                          if r["jobs"] > 1 else 1.0)
            r["of_machine"] = (round(r["ratio"] / r["machine_ratio"], 3)
                               if r["ratio"] is not None else None)
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"cores: {os.cpu_count()}, load average at the end: "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    extra = f" {'machine':>8} {'of it':>6} {'32 MiB':>7}" if args.ceiling else ""
    print(f"{'jobs':>4} {'seconds':>8} {'examples':>9} {'examples/s':>11} {'steps':>8} "
          f"{'steps/s':>8} {'per CPU s':>10} {'ratio [min-max]':>19} {'findings':>9}{extra}")
    for r in rows:
        ratio = ("-" if r["ratio"] is None else
                 f"{r['ratio']:.2f} [{r['ratio_min']:.2f}-{r['ratio_max']:.2f}]")
        cpu = "-" if r["steps_per_cpu_s"] is None else f"{r['steps_per_cpu_s']:.0f}"
        if args.ceiling:
            of = "-" if r["of_machine"] is None else f"{r['of_machine']:.2f}"
            extra = f" {r['machine_ratio']:8.2f} {of:>6} {r['machine_32mib_ratio']:7.2f}"
        print(f"{r['jobs']:4d} {r['seconds']:8.1f} {r['examples']:9d} {r['examples_per_s']:11.2f} "
              f"{r['steps']:8d} {r['steps_per_s']:8.1f} {cpu:>10} {ratio:>19} {r['findings']:9d}"
              f"{extra}")
    print(f"medians over {args.rounds} round(s), each running every job count once "
          f"(order alternating); steps/s by round: "
          + "; ".join(f"{r['jobs']} job(s) {', '.join(f'{x:.0f}' for x in r['steps_per_s_rounds'])}"
                      for r in rows))
    print("ratio = steps/s with N jobs / (N x steps/s with one job), in the same round")
    if args.ceiling:
        print("machine / 32 MiB = the same ratio for N processes of plain Python work in "
              "a core's own caches / over 32 MiB each; of it = ratio / machine")


if __name__ == "__main__":
    main()
