"""Engine modes side by side (docs/design.md §5, §6, §8): a parity sweep of seeded workloads in
each mode with every checker on, and each mode's figures. Prints tables and writes
``modes.json`` under ``--out``.

    python bench/modes.py --device sim --workloads 200 --jobs 2 --out /tmp/modes
    python bench/modes.py --device cuda --out bench-out      # several minutes on one H100

Modes are ``EngineConfig`` switches: ``standard`` (the defaults), ``verify-sync``,
``kv-backup``, ``tp2`` (two logical ranks: sim only), ``zero-bubble``, and the engine
breadth options ``ring`` (the ring FutureMap), ``tree`` (topk 2), ``prefix-cache`` and
``forward-thread`` where the config has the field. A mode a config rejects is reported
as skipped.

Parity sweep. Seed s gives a small config (page size 1/2/4, spec steps 1-4, draft kind,
running cap, chunk, a tight or a roomy pool) and a generated workload; each mode runs
it with every checker on. sim: ``execute`` under a random schedule (its parity checker
compares with the clean non-overlap reference); a run with findings writes a repro
(``overlapcheck replay FILE``). cuda: ``run_checked`` against a cuda non-overlap run of
the standard config (floats may differ from the CPU's), the trained model on every fifth
workload, ``--cuda-seconds`` at most. Each mode's per-request tokens, finish reasons and
accept lengths (tokens only for ``tree``, whose drafts are its own) are also compared
with the standard mode's run (an aborted request: the
common prefix).

Figures. sim: engine steps/s per mode on one thread, oracle model, unchecked (no
observer, detector off) and checked (every checker, detector on, declared accesses).
cuda: steady decode tokens/s per mode and non-overlap, trained model, batch 8 and 32,
timed as bench/gpu_overlap.py times them (docs/design.md §8.1: a fixed timed range, warm-up
rounds until settled, the measured rounds together with their windows taking turns, each
round's rate against the same windows of the other rounds, medians with min-max), as
ratios to standard; the
card, driver and clocks printed and in the JSON. Figures are printed, never asserted.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import sys
import time

import torch

from overlapcheck import seeds
from overlapcheck.device import check_available, device_info
from overlapcheck.engine import EngineConfig, make_engine
from overlapcheck.engine.drafts import DRAFT_KINDS
from overlapcheck.protocol import generate

from modes_figures import model, print_figures, sim_figures, throughput


def engine_modes(device: str) -> dict:
    """Mode name -> config switches; zero-bubble when the config knows it."""
    fields = {f.name for f in dataclasses.fields(EngineConfig)}
    out = {"standard": {}, "verify-sync": {"verify_sync": True}, "kv-backup": {"kv_backup": True}}
    if "zero_bubble" in fields:
        out["zero-bubble"] = {"zero_bubble": True}
    # the engine breadth options (docs/design.md §4.11-4.14), where the config has them
    for name, switch in (("ring", ("future_map", "ring")), ("tree", ("topk", 2)),
                         ("prefix-cache", ("prefix_cache", True)),
                         ("forward-thread", ("forward_thread", True))):
        if switch[0] in fields:
            out[name] = dict((switch,))
    if device_info(device).replayable:     # logical ranks run on the sim
        out["tp2"] = {"tp": 2}
    return out


def sweep_case(seed: int, model_name: str = "oracle"):
    """Seed -> (a small config, a workload), both derived from the seed only."""
    rng = seeds.stream(seed, "modes-sweep")
    page, row = rng.choice((1, 2, 4)), 48
    cfg = EngineConfig(page_size=page, row_width=row, spec_steps=rng.randint(1, 4),
                       draft_kind=rng.choice(tuple(DRAFT_KINDS)), max_running=rng.choice((2, 3, 4, 6)),
                       chunk_size=rng.choice((4, 8, 16)), model=model_name,
                       pool_tokens=rng.choice((row + 2 * page, row + 8 * page, 512)))
    return cfg, generate(seed, rng.randint(6, 12), cfg, max_prompt=16, max_new=24)


# modes whose drafts differ from the standard mode's by design (a tree proposes more
# branches): their tokens must equal the standard run's, their accept lengths need not
OWN_DRAFTS = ("tree",)


def compare(base, got, accept: bool = True):
    """None when ``got`` has the standard run's tokens, finish reasons and (with
    ``accept``) accept lengths per request (an aborted request: the common prefix), else
    what differs first."""
    if base is None or got is None:
        return "no result to compare"
    for rid, a in sorted(base.requests.items()):
        b = got.requests.get(rid)
        if b is None:
            return f"request {rid} missing"
        if "abort" in (a.finish_reason, b.finish_reason):
            n = min(len(a.tokens), len(b.tokens))
            if a.tokens[:n] != b.tokens[:n]:
                return f"request {rid}: tokens differ before its abort"
            continue
        if (a.tokens, a.finish_reason) != (b.tokens, b.finish_reason):
            return f"request {rid}: {a.finish_reason} {list(a.tokens)} vs {b.finish_reason} {list(b.tokens)}"
        if accept and a.accept_lens != b.accept_lens:
            return f"request {rid}: accept lengths {list(a.accept_lens)} vs {list(b.accept_lens)}"
    return None


def run_one(cfg, wl, seed, device, ref, repro_dir, accept=True):
    """One checked run: (first lines of its findings, its RunResult, steps). ``ref`` None:
    ``execute`` on the sim, its own reference; else ``run_checked`` against ``ref``, whose
    accept lengths parity holds this run to only with ``accept`` (a mode whose drafts
    are its own, ``OWN_DRAFTS``, is held to its tokens)."""
    if ref is None:
        from overlapcheck.run import Case, ScheduleSpec, execute
        case = Case(cfg, wl, ScheduleSpec("random", seed))
        out = execute(case, device=device)
        if out.findings and repro_dir:
            from overlapcheck.repro.format import Repro, current_commit, save
            f = out.findings[0]
            save(Repro(case, out.choices, f, out.digest, steps=out.steps, commit=current_commit(),
                       note=f"bench/modes.py seed {seed}"), os.path.join(repro_dir, f"{f.ident}-{seed}.yaml"))
        return [f.text.splitlines()[0] for f in out.findings], out.result, out.steps
    from overlapcheck.run import run_checked
    run = run_checked(cfg, wl, seed=seed, device=device, model=model(cfg.model), reference=ref,
                      trace=False, parity_accept=accept)
    if run.status == "crashed":     # the engine's own failure is a finding
        return [run.problems[0].text.splitlines()[0]], None, 0
    found = [str(v).splitlines()[0] for v in run.violations]
    if run.status != "completed":
        found.append(f"[run] {run.status}")
    return found, run.result, run.engine.iteration


def sweep_one(seed, device="sim", modes=None, model_name="oracle", same_device_ref=False,
              repro_dir=None) -> dict:
    """Every mode on seed ``seed``'s workload; the record of each run."""
    modes = modes if modes is not None else engine_modes(device)
    cfg0, wl = sweep_case(seed, model_name)
    ref = None
    if same_device_ref:   # the standard config, non-overlap, on this device
        from overlapcheck.device import make_runtime
        rt = make_runtime(device, seed=seed, strategy="eager", detect=False, access="declared")
        ref = make_engine(dataclasses.replace(cfg0, overlap=False), rt, model(model_name)).run(wl)
    rec = {"seed": seed, "model": model_name, "requests": len(wl.requests), "modes": {},
           "config": {k: getattr(cfg0, k) for k in ("page_size", "pool_tokens", "spec_steps",
                                                    "draft_kind", "max_running", "chunk_size")}}
    rec["config"]["pool"] = "roomy" if cfg0.pool_tokens >= 512 else "tight"
    base = None
    for name, kw in modes.items():
        try:
            cfg = dataclasses.replace(cfg0, **kw)
        except ValueError as e:
            rec["modes"][name] = {"skipped": str(e)}
            continue
        t = time.perf_counter()
        found, res, steps = run_one(cfg, wl, seed, device, ref, repro_dir,
                                    accept=name not in OWN_DRAFTS)
        if name == "standard":
            base = res
        rec["modes"][name] = {"findings": found[:3], "steps": steps, "seconds": time.perf_counter() - t,
                              "mismatch": None if name == "standard" else compare(
                                  base, res, accept=name not in OWN_DRAFTS),
                              "retractions": res.summary.retractions if res else 0,
                              "aborts": res.summary.aborts if res else 0}
    return rec


def _init_worker():
    torch.set_num_threads(1)


def _sweep_job(job):
    return sweep_one(*job)


def sweep(args, modes) -> list:
    seeds_ = range(args.first_seed, args.first_seed + args.workloads)
    if device_info(args.device).replayable:
        jobs = [(s, args.device, modes, args.sweep_model, False, args.repro_dir) for s in seeds_]
        if args.jobs <= 1:
            _init_worker()
            return [_sweep_job(j) for j in jobs]
        with multiprocessing.get_context("spawn").Pool(args.jobs, _init_worker) as pool:
            return sorted(pool.imap_unordered(_sweep_job, jobs), key=lambda r: r["seed"])
    out, t0 = [], time.perf_counter()        # cuda: one process, a time box
    for s in seeds_:
        if time.perf_counter() - t0 > args.cuda_seconds:
            print(f"  cuda sweep stopped at its time box after {len(out)} workloads")
            break
        out.append(sweep_one(s, args.device, modes, "trained" if s % 5 == 0 else "oracle", True))
    return out


def sweep_table(records, modes) -> dict:
    table = {}
    for name in modes:
        rs = [r["modes"][name] for r in records if name in r["modes"]]
        ran = [m for m in rs if "skipped" not in m]
        table[name] = {
            "runs": len(ran), "skipped": len(rs) - len(ran),
            "with_findings": sum(bool(m["findings"]) for m in ran),
            "token_mismatches": sum(m["mismatch"] is not None for m in ran),
            "steps": sum(m["steps"] for m in ran), "seconds": round(sum(m["seconds"] for m in ran), 1),
            "retractions": sum(m["retractions"] for m in ran), "aborts": sum(m["aborts"] for m in ran),
            "first": [{"seed": r["seed"], "model": r["model"], "findings": r["modes"][name]["findings"],
                       "mismatch": r["modes"][name].get("mismatch")} for r in records
                      if name in r["modes"] and (r["modes"][name].get("findings") or
                                                 r["modes"][name].get("mismatch"))][:5]}
    return table


def coverage(records) -> str:
    def count(key):
        vals = [r["config"][key] for r in records]
        return "/".join(f"{v} {vals.count(v)}" for v in sorted(set(vals), key=str))
    return (f"workloads: page {count('page_size')}; draft {count('draft_kind')}; "
            f"spec steps {count('spec_steps')}; pool {count('pool')}")


def print_tables(doc) -> None:
    print(f"\nparity sweep ({doc['device']}): runs with findings, token mismatches vs standard")
    print(f"{'mode':12s} {'runs':>5s} {'skip':>5s} {'findings':>9s} {'mismatch':>9s} {'steps':>7s} "
          f"{'retract':>8s} {'aborts':>7s} {'s':>7s}")
    for name, t in doc["sweep"].items():
        print(f"{name:12s} {t['runs']:5d} {t['skipped']:5d} {t['with_findings']:9d} {t['token_mismatches']:9d} "
              f"{t['steps']:7d} {t['retractions']:8d} {t['aborts']:7d} {t['seconds']:7.1f}")
        for f in t["first"]:
            print(f"    seed {f['seed']} ({f['model']}): {(f['findings'] or [f['mismatch']])[0][:150]}\n"
                  f"      python bench/modes.py --device {doc['device']} --first-seed {f['seed']} "
                  f"--workloads 1 --modes {name} --no-figures")
    print(f"  {doc['coverage']}")
    print_figures(doc)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="sim", choices=("sim", "cuda"))
    ap.add_argument("--workloads", type=int, default=None,
                    help="sweep workloads per mode (default 200 on sim, 20 on cuda)")
    ap.add_argument("--first-seed", type=int, default=0, help="seed of the first workload")
    ap.add_argument("--modes", default="", help="comma-separated subset (default: all)")
    ap.add_argument("--jobs", type=int, default=1, help="sweep processes (sim; cuda uses one)")
    ap.add_argument("--sweep-model", default="oracle", help="sim sweep: model (oracle: host-length "
                    "reading off; oracle-hostlens: drafts read the host's sequence lengths)")
    ap.add_argument("--cuda-seconds", type=float, default=100.0, help="time box of the cuda sweep")
    ap.add_argument("--figure-requests", type=int, default=48, help="sim figures: workload size")
    ap.add_argument("--model", default="trained", help="cuda figures: model")
    ap.add_argument("--batch", default="8,32", help="cuda figures: comma-separated batch sizes")
    ap.add_argument("--steps", type=int, default=12, help="cuda figures: steady steps per timed window")
    ap.add_argument("--settle", type=int, default=3)
    ap.add_argument("--windows", type=int, default=4,
                    help="cuda figures: timed windows per run (a fixed range), taking turns with "
                         "the same window of every mode and round")
    ap.add_argument("--tol", type=float, default=0.03,
                    help="cuda figures: warm-up until each mode agrees with its previous round within this")
    ap.add_argument("--warmup-rounds", type=int, default=4, help="cuda figures: cap on warm-up rounds")
    ap.add_argument("--repeat", type=int, default=6, help="cuda figures: measured rounds (even: balanced)")
    ap.add_argument("--no-figures", action="store_true", help="the parity sweep only")
    ap.add_argument("--out", default="bench-out", help="folder for modes.json and repros")
    args = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    if args.workloads is None:
        args.workloads = 20 if device_info(args.device).gpu else 200
    try:
        check_available(args.device)
    except RuntimeError as e:
        ap.error(str(e))
    modes = engine_modes(args.device)
    if args.modes:
        want = ["standard"] + [m for m in args.modes.split(",") if m and m != "standard"]
        bad = [m for m in want if m not in modes]
        if bad:
            ap.error(f"unknown mode {bad[0]!r} on {args.device} (modes: {', '.join(modes)})")
        modes = {m: modes[m] for m in want}
    if args.workloads < 0 or args.jobs < 1:
        ap.error("--workloads must be >= 0 and --jobs >= 1")
    os.makedirs(args.out, exist_ok=True)
    args.repro_dir = os.path.join(args.out, "repros")
    t0 = time.perf_counter()
    import gpu_observe
    doc = {"device": args.device, "gpu": gpu_observe.gpu_info(args.device),
           "torch": torch.__version__, "modes": modes, "args": vars(args)}
    print(gpu_observe.gpu_line(doc["gpu"]))
    print(f"modes: {', '.join(modes)}; {args.workloads} workloads from seed {args.first_seed}")
    records = sweep(args, modes)
    doc["sweep"] = sweep_table(records, modes)
    doc["coverage"] = coverage(records)
    doc["sweep_seconds"] = round(time.perf_counter() - t0, 1)
    doc["records"] = records
    if not args.no_figures:
        if device_info(args.device).cpu_work:
            doc["sim_figures"] = sim_figures(modes, args.figure_requests, 2)
        else:
            doc["throughput"] = throughput(args.device, modes, args.model,
                                           [int(b) for b in args.batch.split(",") if b],
                                           args.steps, args.settle, args.repeat, args.windows,
                                           args.tol, args.warmup_rounds)
            doc["gpu_end"] = gpu_observe.gpu_info(args.device)
    doc["seconds"] = round(time.perf_counter() - t0, 1)
    with open(os.path.join(args.out, "modes.json"), "w") as fh:
        json.dump(doc, fh, indent=1, default=str)
    print_tables(doc)
    bad = sum(t["with_findings"] + t["token_mismatches"] for t in doc["sweep"].values())
    print(f"\ndone in {doc['seconds']} s (sweep {doc['sweep_seconds']} s); "
          f"{os.path.join(args.out, 'modes.json')}; runs with findings or mismatches: {bad}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
