"""Checked scheduler steps per second of the vLLM target on one core.

Runs seeded workloads through vLLM 0.33.0's real scheduler with the fake runner, every
vLLM and shared checker on (parity against the sync reference), and prints host steps
per second with and without the checkers, per configuration; session setup is counted,
vLLM's one-time import is not. Needs the vLLM target installed (README).

    python bench/target_vllm.py [--seeds 20]
"""
from __future__ import annotations

import argparse
import os
import time
from dataclasses import replace


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20)
    args = ap.parse_args()
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    from overlapcheck import seeds
    from overlapcheck.device.sched import Random
    from overlapcheck.engine import EngineConfig, generate
    from overlapcheck.targets.vllm import VllmTarget, VllmTargetConfig
    from overlapcheck.targets.vllm.checked import run_checked
    target = VllmTarget()
    print(f"vllm {target.version()}; one core; {args.seeds} seeded workloads of 10 requests")
    base = VllmTargetConfig(num_blocks=16, max_model_len=60)
    cfgs = {"async q2": base, "async q2 deferred": replace(base, defer_block_free=True),
            "async q3": replace(base, batch_queue=3),
            "sync": replace(base, scheduler="sync", batch_queue=1)}
    room = base.max_model_len - base.spec_tokens - 1
    loads = [generate(s, 10, EngineConfig(), max_prompt=room * 2 // 5,
                      max_new=room - room * 2 // 5) for s in range(args.seeds)]
    run_checked(base, loads[0], names=("lifecycle",), target=target)     # warm the import
    print(f"{'config':<20} {'steps':>7} {'checked/s':>10} {'1 checker/s':>11} {'ratio':>6} "
          f"{'violations':>10}")
    for name, cfg in cfgs.items():
        refs = [run_checked(replace(cfg, scheduler="sync", batch_queue=1), w, names=("lifecycle",),
                            target=target).result for w in loads]
        rates, steps, found = [], 0, 0
        for names in ((), ("lifecycle",)):       # all checkers, then lifecycle alone
            t0, n = time.perf_counter(), 0
            for s, (w, ref) in enumerate(zip(loads, refs)):
                r = run_checked(cfg, w, Random(seeds.stream(s, "schedule")), names=names,
                                reference=ref, parity_accept=False, target=target)
                n += r.steps
                if not names:
                    found += len(r.violations) + (r.error is not None)
            rates.append(n / (time.perf_counter() - t0))
            steps = n
        print(f"{name:<20} {steps:>7} {rates[0]:>10.0f} {rates[1]:>11.0f} "
              f"{rates[0] / rates[1]:>6.2f} {found:>10}")


if __name__ == "__main__":
    main()
