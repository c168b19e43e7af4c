"""Detection bench: every fault of a target found from a cold start (docs/design.md §8).

For every fault of ``--target`` (default: the reference engine's bug zoo; ``vllm`` and
``sglang``: their historical bugs re-created), ``--runs`` cold-start campaigns (different seeds, all checkers on,
no example database) with that one fault switched on; per fault: how many campaigns
found it *through its documented checker*, the time, examples and engine steps to that
first finding (median, max), the minimized repro's size (steps, requests), the other
checkers that fired and the engine exceptions (tallied apart). The clean engine runs
under the same budget and must find nothing. ``--race-off`` reruns faults 2, 11 and 12
with the happens-before checkers (stream-race, kv-lifetime) off: a finding by parity,
kv-canary or lifecycle shows the sim really served stale data.

    python bench/detect.py [--target NAME] [--seconds 20] [--shrink 10] [--runs 5] [--jobs 2]
                           [--config FILE.yaml] [--json detect.json]

``--config`` holds a target's config fields fixed in every campaign, as ``fuzz
--config`` does (``worker: eagle-v2``: SGLang's real spec worker); the faults are then
those whose patched code the config's worker runs (a fault's ``worker``), unless
``--fault`` names them.

``--seconds`` is each campaign's time box, shrinking included (``--shrink``: seconds
shrinking may run past it). Each worker process runs one small case before its first
campaign (the engine's import and first build are per process, not per campaign).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from multiprocessing import Pool

CLEAN = "(clean)"
RACE_CHECKERS = ("stream-race", "kv-lifetime")
DATA_CHECKERS = ("parity", "kv-canary", "lifecycle")
RACE_OFF_FAULTS = ("no-war-barrier", "no-copy-done-wait", "single-staging-buffer")


def _warm(target: str, config=None) -> None:
    """Pool initializer: import the target's engine and run one small case, so that
    the one-time cost of a process (a real engine's import and first build, 10-40 s
    for SGLang) is paid once per worker and not inside the first campaign's time box.
    Campaigns reuse the worker's builds as a fuzz process reuses them between runs."""
    import torch
    torch.set_num_threads(1)
    from overlapcheck import targets
    from overlapcheck.run import Case, ScheduleSpec, execute
    t = targets.get(target)
    cfg = t.config_from_dict(dict(config)) if config else t.default_config()
    try:
        execute(Case(cfg, t.generate(0, 1, cfg), ScheduleSpec("stalls", 0, ()), (), (), target))
    except Exception:  # noqa: BLE001 - a warm-up only: the campaigns report what fails
        pass


def _campaign(job: tuple) -> dict:
    """One cold-start campaign; returns its findings, reduced to what the table needs."""
    name, seed, seconds, checks, shrink, target, known, config = job
    import torch
    torch.set_num_threads(1)
    from overlapcheck.fuzz.campaign import Campaign, Options
    with tempfile.TemporaryDirectory() as out:
        c = Campaign(Options(seconds=seconds, seed=seed, checks=checks, out=out,
                             shrink_seconds=shrink, target=target, known=known,
                             faults=() if name == CLEAN else (name,), config=config)).run()
        s = c.summary()
    keep = ("checker", "examples_before", "seconds_before", "steps_before", "repro_steps",
            "repro_requests")
    return {"fault": name, "seed": seed, "examples": s["examples"], "seconds": s["seconds"],
            "findings": [{k: f[k] for k in keep} | {"site": f["site"]} for f in s["findings"]]}


def _first(run: dict, checkers) -> dict:
    hits = [f for f in run["findings"] if f["checker"] in checkers]
    return min(hits, key=lambda f: (f["examples_before"], f["seconds_before"])) if hits else None


def _med(xs):
    return round(statistics.median(xs), 2) if xs else None


def summarize(name: str, runs, checkers) -> dict:
    firsts = [f for f in (_first(r, checkers) for r in runs) if f is not None]
    others = sorted({f["checker"] for r in runs for f in r["findings"]} - set(checkers)
                    - {"engine-exception"})
    return {"fault": name, "checkers": list(checkers), "found": len(firsts), "runs": len(runs),
            "seconds_median": _med([f["seconds_before"] for f in firsts]),
            "seconds_max": max((f["seconds_before"] for f in firsts), default=None),
            "examples_median": _med([f["examples_before"] for f in firsts]),
            "steps_median": _med([f["steps_before"] for f in firsts]),
            "repro_steps_median": _med([f["repro_steps"] for f in firsts]),
            "repro_requests_median": _med([f["repro_requests"] for f in firsts]),
            "other_checkers": others,
            "engine_exceptions": sum(f["checker"] == "engine-exception"
                                     for r in runs for f in r["findings"]),
            "findings_total": sum(len(r["findings"]) for r in runs)}


def _table(rows, title: str) -> str:
    head = (f"{'fault':<24} {'cls':>3} {'checker':<26} {'found':>5} {'t med':>6} {'t max':>6} "
            f"{'ex med':>6} {'steps':>7} {'repro st/rq':>11} {'exc':>3}  also")
    lines = [title, head, "-" * len(head)]
    for r in rows:
        t = lambda x: "-" if x is None else f"{x:g}"  # noqa: E731
        lines.append(f"{r['fault']:<24} {r.get('cls', ''):>3} {','.join(r['checkers']):<26} "
                     f"{r['found']}/{r['runs']:<3} {t(r['seconds_median']):>6} "
                     f"{t(r['seconds_max']):>6} {t(r['examples_median']):>6} "
                     f"{t(r['steps_median']):>7} "
                     f"{t(r['repro_steps_median']) + '/' + t(r['repro_requests_median']):>11} "
                     f"{r['engine_exceptions']:>3}  {','.join(r['other_checkers'])}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="reference", help="the engine (default reference)")
    ap.add_argument("--seconds", type=float, default=20.0, help="budget per campaign")
    ap.add_argument("--shrink", type=float, default=10.0,
                    help="seconds shrinking may run past the budget")
    ap.add_argument("--runs", type=int, default=5, help="campaigns (seeds) per fault")
    ap.add_argument("--jobs", type=int, default=2, help="campaigns in parallel")
    ap.add_argument("--fault", action="append", default=[], help="only these faults")
    ap.add_argument("--known", action="append", default=[], metavar="REPRO|DIR",
                    help="findings the engine is known to have (repros): not counted")
    ap.add_argument("--config", default=None, metavar="FILE.yaml",
                    help="config fields held fixed in every campaign (as fuzz --config)")
    ap.add_argument("--json", default="detect.json", help="where the results go")
    args = ap.parse_args(argv)
    from invariants.base import names_for
    from overlapcheck import targets
    from overlapcheck.protocol.target import TargetUnavailable
    try:
        target = targets.get(args.target)
        version = target.version()
    except (ValueError, TargetUnavailable) as e:
        ap.error(str(e))
    FAULTS = target.faults()
    unknown = [n for n in args.fault if n not in FAULTS]
    if unknown:
        ap.error(f"unknown fault {unknown[0]!r} of target {args.target}")
    from overlapcheck.errors import UsageError
    config = None
    if args.config:
        from overlapcheck.run.command import read_config
        try:
            config = tuple(sorted(read_config(args.config, target)[0].items()))
        except UsageError as e:
            ap.error(str(e))
    worker = dict(config or ()).get("worker")
    # vLLM's runner faults run on its real runner (config runner: real), the others not
    real_runner = dict(config or ()).get("runner") == "real"
    names = args.fault or sorted(
        n for n, f in FAULTS.items()
        if (worker is None or worker in f.extra.get("worker", (worker,)))
        and ("layer" not in f.extra or (f.extra["layer"] == "runner") == real_runner))
    from overlapcheck.fuzz.command import _known
    try:
        known = _known(args.known, args.target)
    except UsageError as e:
        ap.error(str(e))
    jobs = [(n, s, args.seconds, (), args.shrink, args.target, known, config)
            for n in names + [CLEAN] for s in range(args.runs)]
    no_race = tuple(c for c in names_for(args.target) if c not in RACE_CHECKERS)
    off = [n for n in RACE_OFF_FAULTS if n in names]
    jobs += [(n, 100 + s, args.seconds, no_race, args.shrink, args.target, known, config)
             for n in off for s in range(args.runs)]
    with Pool(args.jobs, initializer=_warm, initargs=(args.target, config)) as pool:
        results = pool.map(_campaign, jobs, chunksize=1)
    by = {}
    for (n, _, _, checks, _, _, _, _), r in zip(jobs, results):
        by.setdefault((n, bool(checks)), []).append(r)
    rows = []
    for n in names:
        row = summarize(n, by[(n, False)], (FAULTS[n].checker,))
        rows.append(dict(row, cls=FAULTS[n].extra.get("class", "")))
    clean = summarize(CLEAN, by[(CLEAN, False)], ())
    race_off = [dict(summarize(n, by[(n, True)], DATA_CHECKERS),
                     cls=FAULTS[n].extra.get("class", "")) for n in off]
    pinned = f", config {dict(config)}" if config else ""
    print(_table(rows, f"detection ({args.target} {version}{pinned}): {args.runs} cold-start campaigns "
                       f"of {args.seconds:g} s per fault, all checkers on (found = through the "
                       f"documented checker)"))
    print(f"\nclean engine: {clean['findings_total']} finding(s) in {args.runs} campaigns "
          f"({sum(r['examples'] for r in by[(CLEAN, False)])} examples)")
    if race_off:
        print("\n" + _table(race_off, "stream-race and kv-lifetime off: caught by parity, "
                                      "kv-canary or lifecycle"))
    doc = {"target": args.target, "engine_version": version, "seconds": args.seconds,
           "runs": args.runs, "config": dict(config or ()), "faults": rows, "clean": clean,
           "race_off": race_off, "campaigns": results}
    with open(args.json, "w") as fh:
        json.dump(doc, fh, indent=1)
    print(f"\nwritten: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
