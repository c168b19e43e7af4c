"""The race detector on the GPU (docs/design.md §3.5-3.6, §7): the fault-free engine gives no race
report on cuda, and each bug-zoo fault that stream-race or kv-lifetime catches on the sim
is caught on cuda too, and by PyTorch's CUDA sanitizer where it can see it. Prints a
table and writes ``gpu_detect.json`` under ``--out``.

    python bench/gpu_detect.py --device cuda --out bench-out          # ~1-2 min on one GPU
    python bench/gpu_detect.py --device sim --out /tmp/gd --faults no-war-barrier

Method. Clean: small generated workloads (5 requests, short outputs) under overlap and
spec, each draft kind, with ``kv_backup`` once and ``verify_sync`` once, run with
stream-race and kv-lifetime on: no violation and no detector report is expected. Faults:
for each fault whose documented checker is stream-race or kv-lifetime, the first case
the fuzzer's strategy draws (ci settings: derandomized, generate phase only, up to
``--examples``) that the sim finds through that checker; it is kept as a repro under
``--out/cases`` and reused by later runs. That case's config and workload, fault on,
then run on ``--device`` with our detector: its clocks follow the host's issue order, so
it should flag the same pair whatever the GPU timing was. On cuda, each fault case and
the clean runs (all in one process) also run with our detector off under
``TORCH_CUDA_SANITIZER=1``, one subprocess each (the sanitizer is process-wide and raises
on its first error): "flagged" or "not flagged". Exit status 1 when a clean run reports
anything or a fault found on the sim is not found on ``--device``; 0 otherwise.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from overlapcheck.device import check_available, device_info  # noqa: E402
from overlapcheck.engine import EngineConfig  # noqa: E402
from overlapcheck.engine.faults import FAULTS  # noqa: E402
from overlapcheck.protocol import generate  # noqa: E402
from overlapcheck.run import Case, ScheduleSpec, execute  # noqa: E402

RACE = ("stream-race", "kv-lifetime")
BASE = EngineConfig(page_size=2, pool_tokens=96, row_width=32, max_running=4, chunk_size=8,
                    spec_steps=3)
CLEAN = (("standalone", {}, (0, 1)), ("eagle", {"draft_kind": "eagle"}, (2,)),
         ("mtp", {"draft_kind": "mtp"}, (3,)), ("kv_backup", {"kv_backup": True}, (4,)),
         ("verify_sync", {"verify_sync": True}, (5,)))


def race_faults(names):
    """The faults to test: ``names`` (comma-separated) or every stream-race/kv-lifetime one."""
    every = [n for n, f in FAULTS.items() if f.checker in RACE]
    chosen = [n.strip() for n in names.split(",") if n.strip()] if names else every
    bad = [n for n in chosen if n not in every]
    if bad:
        raise ValueError(f"--faults: {bad[0]!r} is not one of {', '.join(every)}")
    return chosen


def clean_cases():
    """(label, case) for every clean run: overlap and spec on, fault-free."""
    out = []
    for label, kw, seeds in CLEAN:
        cfg = dataclasses.replace(BASE, **kw)
        for s in seeds:
            wl = generate(s, 5, cfg, max_prompt=10, max_new=16)
            out.append((f"{label}/{s}", Case(cfg, wl, ScheduleSpec("random", s), RACE)))
    return out


def run_one(case, device, detect=True):
    """Run ``case`` (its faults on, the race checkers only) on ``device``: the outcome
    and the runtime."""
    from overlapcheck.run import execute
    from overlapcheck.device import make_runtime
    rt = make_runtime(device, strategy=case.schedule.make(), detect=detect, access="declared")
    return execute(case, runtime=rt, trace=False), rt


def checked(case, device):
    """``run_one`` summarized: status, violations (checker, report kind), reports. An
    engine exception ends the run; its detector reports stand in for the checkers."""
    from invariants.kv_lifetime import is_request_reuse
    run, rt = run_one(case, device)
    if run.status == "crashed":
        steps, status = None, "exception: " + run.problems[0].text.split(": ", 1)[1].splitlines()[0]
        viol = [{"checker": "kv-lifetime" if is_request_reuse(r) else "stream-race",
                 "kind": r.kind, "message": str(r).splitlines()[0]} for r in rt.reports]
    else:
        status, steps = run.status, run.steps
        viol = [{"checker": v.checker, "kind": v.site[0] if v.site else "",
                 "message": v.message} for v in run.violations]
    return {"status": status, "steps": steps, "violations": viol, "reports": len(rt.reports),
            "report_kinds": sorted({r.kind for r in rt.reports})}


def hunt(name, examples):
    """The first drawn case the sim finds through ``name``'s checker: (case, outcome,
    finding, examples tried) or None."""
    from hypothesis import HealthCheck, Phase, given, settings
    from overlapcheck.fuzz.strategies import cases
    want, hits, tried = FAULTS[name].checker, [], [0]

    @settings(derandomize=True, database=None, deadline=None, max_examples=examples,
              phases=(Phase.generate,), suppress_health_check=list(HealthCheck))
    @given(cases(RACE, (name,)))
    def prop(case):
        if hits or case.config.tp > 1:      # logical ranks exist on the sim only
            return
        tried[0] += 1
        out = execute(case)
        found = [f for f in out.findings if f.checker == want]
        if found:
            hits.append((case, out, found[0], tried[0]))

    prop()
    return hits[0] if hits else None


def sim_case(name, out_dir, examples):
    """``name``'s triggering case and sim finding, from ``out_dir/cases`` or a fresh hunt:
    a dict (case None when the hunt found nothing)."""
    from overlapcheck.repro.format import Repro, ReproError, load, save
    path = os.path.join(out_dir, "cases", f"{name}.yaml")
    try:
        r = load(path)
        if name in r.case.faults and r.finding.checker == FAULTS[name].checker:
            return {"case": r.case, "finding": r.finding, "examples": None, "repro": path}
    except ReproError:
        pass
    hit = hunt(name, examples)
    if hit is None:
        return {"case": None, "finding": None, "examples": examples, "repro": None}
    case, out, finding, tried = hit
    os.makedirs(os.path.dirname(path), exist_ok=True)
    save(Repro(case, out.choices, finding, out.digest, "sim", out.steps), path)
    return {"case": case, "finding": finding, "examples": tried, "repro": path}


def sanitizer_start(label, cases, out_dir):
    """Start one sanitizer subprocess over ``cases``: (Popen, start time)."""
    path = os.path.join(out_dir, "sanitizer", f"{label}.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        json.dump({"cases": [c.to_dict() for c in cases]}, fh)
    env = dict(os.environ, TORCH_CUDA_SANITIZER="1")   # on at `import torch`
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, os.path.abspath(__file__), "--device", "cuda", "--sanitizer-case", path]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True), time.monotonic()


def sanitizer_verdict(job, timeout_s):
    """Wait for a sanitizer subprocess: "flagged", "not flagged" or "error: ..."."""
    from overlapcheck.selftest.sanitizer import FLAGGED, parse
    proc, t0 = job
    try:
        so, se = proc.communicate(timeout=max(1.0, timeout_s - (time.monotonic() - t0)))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return f"error: timed out after {timeout_s:g}s"
    verdict = parse(proc.returncode, so, se)
    if verdict.startswith("error") and ("CSAN" in se or "Detected" in se):
        return FLAGGED   # the sanitizer's error escaped the child's own handling
    return verdict


def sanitizer_child(path):
    """``--sanitizer-case FILE``: run its cases on cuda, our detector off, under PyTorch's
    CUDA sanitizer; one JSON line (the selftest child's format)."""
    import torch
    from overlapcheck.selftest.sanitizer import _emit, _headline, _sanitizer_errors
    if not torch.cuda.is_available():
        print("gpu_detect: error: the sanitizer needs a CUDA GPU", file=sys.stderr)
        return 2
    import torch.cuda._sanitizer as csan
    if not csan.cuda_sanitizer.enabled:
        csan.enable_cuda_sanitizer()
    with open(path) as fh:
        cases = [Case.from_dict(d) for d in json.load(fh)["cases"]]
    for i, case in enumerate(cases):
        try:   # the engine alone (no driver catching its exceptions): the sanitizer raises
            from overlapcheck import targets
            from overlapcheck.device import make_runtime
            rt = make_runtime("cuda", detect=False)
            targets.get(case.target).open(case.config, None, None, case.faults,
                                          runtime=rt).run(case.workload)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - classified below
            found = _sanitizer_errors(e, csan.CUDASanitizerErrors)
            if found is None:
                _emit(case=i, error=True, message=f"{type(e).__name__}: {e}".splitlines()[0])
                return 3
            errs = getattr(found, "errors", [])
            _emit(case=i, flagged=True, errors=len(errs),
                  message=_headline(str(errs[0]) if errs else str(found)))
            return 0
    _emit(case=len(cases), flagged=False, errors=0, message="")
    return 0


def found_text(violations, checker):
    """A table cell: "yes (kind)" through ``checker``, "via other (kind)" or "no"."""
    mine = [v for v in violations if v["checker"] == checker]
    if mine:
        return f"yes ({mine[0]['kind']})"
    other = [v for v in violations if v["checker"] in RACE]
    return f"via {other[0]['checker']} ({other[0]['kind']})" if other else "no"


def fault_row(name, sim, dev, sanitizer):
    f = FAULTS[name]
    row = {"fault": name, "class": f.extra["class"], "checker": f.checker, "repro": sim["repro"],
           "sim_examples": sim["examples"], "cached": sim["examples"] is None,
           "sanitizer": sanitizer, "device_run": dev,
           "sim": "no" if sim["finding"] is None else f"yes ({sim['finding'].site[0]})"}
    row["device"] = "n/a (no sim case)" if dev is None else found_text(dev["violations"], f.checker)
    row["device_found"] = row["device"].startswith("yes")
    return row


def table(rows, clean, device):
    head = (f"{'fault':<24} {'cls':>3} {'checker':<12} {'found on sim':<28} "
            f"{'ours on ' + device:<28} PyTorch sanitizer")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['fault']:<24} {r['class']:>3} {r['checker']:<12} {r['sim']:<28} "
                     f"{r['device']:<28} {r['sanitizer']}")
    lines.append(f"clean: {len(clean['runs'])} runs in {len(CLEAN)} configs; ours: "
                 f"{clean['violations']} violations, {clean['reports']} reports; "
                 f"sanitizer: {clean['sanitizer']}")
    return "\n".join(lines)


def run_clean(device):
    runs = [dict(checked(c, device), label=label) for label, c in clean_cases()]
    return {"runs": runs, "violations": sum(len(r["violations"]) for r in runs),
            "reports": sum(r["reports"] for r in runs)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "sim"), default="cuda")
    ap.add_argument("--out", default="bench-out", help="output folder (JSON, cached cases)")
    ap.add_argument("--faults", default="", help="comma-separated faults (default: every "
                    "stream-race/kv-lifetime fault)")
    ap.add_argument("--examples", type=int, default=200, help="hunt budget per fault (sim)")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per sanitizer process")
    ap.add_argument("--no-sanitizer", action="store_true", help="skip the sanitizer column")
    ap.add_argument("--sanitizer-case", metavar="FILE", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.sanitizer_case:
        return sanitizer_child(args.sanitizer_case)
    try:
        t0, names = time.monotonic(), race_faults(args.faults)
    except ValueError as e:
        ap.error(str(e))
    import torch
    try:
        check_available(args.device)
    except RuntimeError as e:
        ap.error(str(e))
    sims = {n: sim_case(n, args.out, args.examples) for n in names}
    sanitize = device_info(args.device).gpu and not args.no_sanitizer
    jobs = {}
    if sanitize:   # the subprocesses run while ours runs below
        jobs = {n: sanitizer_start(n, [s["case"]], args.out) for n, s in sims.items() if s["case"]}
        jobs["(clean)"] = sanitizer_start("clean", [c for _, c in clean_cases()], args.out)
    clean = run_clean(args.device)
    devs = {n: checked(s["case"], args.device) if s["case"] else None for n, s in sims.items()}
    verdicts = {k: sanitizer_verdict(j, args.timeout) for k, j in jobs.items()}
    na = "n/a" if not sanitize else "n/a (no sim case)"
    clean["sanitizer"] = verdicts.get("(clean)", "n/a")
    rows = [fault_row(n, sims[n], devs[n], verdicts.get(n, na)) for n in names]
    gpu = torch.cuda.get_device_name() if device_info(args.device).gpu else args.device
    print(f"detector on {args.device} ({gpu}), torch {torch.__version__}")
    print(table(rows, clean, args.device))
    doc = {"device": args.device, "gpu": gpu, "torch": torch.__version__, "faults": rows,
           "clean": clean, "seconds": round(time.monotonic() - t0, 1)}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "gpu_detect.json")
    with open(path, "w") as fh:
        json.dump(doc, fh, indent=1, default=str)
    print(f"written: {path} ({doc['seconds']} s)")
    missed = [r for r in rows if r["sim"].startswith("yes") and not r["device_found"]]
    return 1 if clean["violations"] or clean["reports"] or missed else 0


if __name__ == "__main__":
    sys.exit(main())
