"""Checked scheduler steps per second of the vLLM target on one core.

Runs seeded workloads through vLLM 0.33.0's real scheduler with the fake runner, via
the run driver (``overlapcheck.run.execute``), and prints host steps per second per
configuration:

* ``checked/s``: every checker that reads the vLLM target on (parity against the sync
  reference run, computed beforehand and passed in, as a fixture would);
* ``+ref/s``: the same with parity's reference run computed inside each ``execute``
  (what a fuzz example costs: two sessions per case);
* ``1 checker/s``: lifecycle alone, the floor the checkers add to.

Rates are per CPU second of this process, pinned to one core (``time.process_time``:
on a shared machine wall time also counts other processes' turns). Session start-up is
counted (a scheduler is built per run); vLLM's one-time import is not. Needs the vLLM
target installed (docs/targets.md).

    python bench/target_vllm.py [--seeds 20] [--requests 10]
"""
from __future__ import annotations

import argparse
import os
import time
from dataclasses import replace


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--requests", type=int, default=10)
    args = ap.parse_args()
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    import torch
    torch.set_num_threads(1)
    from overlapcheck.run import Case, ScheduleSpec, execute
    from overlapcheck.targets.vllm import VllmTarget, VllmTargetConfig
    target = VllmTarget()
    print(f"vllm {target.version()}; one core, steps per CPU second; {args.seeds} seeded "
          f"workloads of {args.requests} requests, random schedule")
    base = VllmTargetConfig(num_blocks=16, max_model_len=60)
    cfgs = {"async q2": base, "async q2 deferred": replace(base, defer_block_free=True),
            "async q3": replace(base, batch_queue=3),
            "sync": replace(base, scheduler="sync", batch_queue=1)}
    loads = [target.generate(s, args.requests, base) for s in range(args.seeds)]

    def run(cfg, s, checks=(), **kw):
        case = Case(cfg, loads[s], ScheduleSpec("random", s), tuple(checks), (), "vllm")
        return execute(case, trace=False, **kw)

    run(base, 0, ("lifecycle",))      # vLLM's import and first-use costs
    print(f"{'config':<20} {'steps':>7} {'checked/s':>10} {'+ref/s':>8} {'1 checker/s':>11} "
          f"{'findings':>8}")
    for name, cfg in cfgs.items():
        ref_cfg = target.reference_config(cfg)
        refs = [run(ref_cfg, s, ("lifecycle",)).result for s in range(args.seeds)]
        rates, steps, found = {}, 0, 0
        for label, checks, with_ref in (("all", (), True), ("+ref", (), False),
                                        ("one", ("lifecycle",), False)):
            t0, n = time.process_time(), 0
            for s in range(args.seeds):
                out = run(cfg, s, checks, reference=refs[s] if with_ref else None)
                n += out.steps
                found += len(out.findings)
            rates[label] = n / (time.process_time() - t0)
            steps = n
        print(f"{name:<20} {steps:>7} {rates['all']:>10.0f} {rates['+ref']:>8.0f} "
              f"{rates['one']:>11.0f} {found:>8}")


if __name__ == "__main__":
    main()
