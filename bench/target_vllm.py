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

With ``--runner real``: vLLM's own V2 model runner (``runner: real``, the tiny Llama
under watch's CPU shim, its Triton kernels interpreted): per configuration, host steps
per CPU second of the session alone (watched, the runner built per run), and checked
(every checker, parity's sync reference run included, as a fuzz example costs), with
the runner's build time per run apart.

    python bench/target_vllm.py [--seeds 20] [--requests 10] [--runner fake|real]
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
    ap.add_argument("--runner", choices=("fake", "real"), default="fake")
    args = ap.parse_args()
    if args.runner == "real":
        return real_runner(args)
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


def real_runner(args) -> None:
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    import torch
    torch.set_num_threads(1)
    from overlapcheck.device.sched import Eager
    from overlapcheck.protocol.workload import Workload
    from overlapcheck.run import Case, ScheduleSpec, execute
    from overlapcheck.targets.vllm import VllmTarget, VllmTargetConfig
    target = VllmTarget()
    base = VllmTargetConfig(runner="real", block_size=16, num_blocks=16, max_model_len=48,
                            vocab=32, spec_tokens=2, long_prefill_token_threshold=0,
                            max_num_batched_tokens=64)
    loads = [Workload(target.generate(s, args.requests, base).requests, ())
             for s in range(args.seeds)]
    s = target.open(base, Eager(), None)
    t0 = time.perf_counter()
    s.run(loads[0])
    print(f"vllm {target.version()} real runner; one core, steps per CPU second; "
          f"{args.seeds} seeded workloads of {args.requests} requests; first run of the "
          f"process (import, model config, build) {time.perf_counter() - t0:.1f} s wall")
    print(f"{'config':<18} {'steps':>6} {'build s':>8} {'session/s':>10} {'checked/s':>10} "
          f"{'findings':>8}")
    for name, cfg in (("async q2 ngram 2", base),
                      ("async q2 no spec", replace(base, spec_tokens=0)),
                      ("sync ngram 2", replace(base, scheduler="sync", batch_queue=1))):
        steps = found = 0
        t_sess = t_build = 0.0
        for w in loads:
            sess = target.open(cfg, Eager(), None)
            t0 = time.process_time()
            sess.run(w)
            t_sess += time.process_time() - t0
            steps += sess.iteration
        from overlapcheck.targets.vllm import real_runner as R
        from overlapcheck.targets.vllm.env import load
        from overlapcheck.watch import watch
        for _ in loads:       # a build alone (watched, as in a run)
            t0 = time.process_time()
            with watch(device="cpu", mode="collect"), R.built(cfg, load()):
                pass
            t_build += time.process_time() - t0
        t0 = time.process_time()
        for w in loads:
            out = execute(Case(cfg, w, ScheduleSpec("stalls", 0, ()), (), (), "vllm"))
            found += len(out.findings)
        t_chk = time.process_time() - t0
        print(f"{name:<18} {steps:>6} {t_build / len(loads):>8.2f} "
              f"{steps / max(t_sess - t_build, 1e-9):>10.2f} {steps / t_chk:>10.2f} {found:>8}")


if __name__ == "__main__":
    main()
