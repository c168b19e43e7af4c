"""The per-mode figures of bench/modes.py (docs/design.md §8), printed, never asserted.

* ``sim_figures``: engine steps/s per mode on the sim, one thread, oracle model,
  unchecked (no observer, detector off) and checked (every checker, detector on,
  declared accesses), best of ``repeat``.
* ``throughput``: steady decode tokens/s per mode and non-overlap on ``device``, timed
  as bench/gpu_overlap.py times it (its ``ModeRun``, ``lockstep`` and ``bench/steady.py``:
  a fixed timed range, warm-up rounds, the measured rounds together with their windows
  taking turns, medians with min-max; docs/design.md §8.1), as ratios
  to the standard mode; logical-rank modes are left out (sim only).
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch

from overlapcheck.engine import EngineConfig, make_engine
from overlapcheck.protocol import generate

_MODELS: dict = {}


def model(name: str):
    """One model object per name and process (the trained pair loads once)."""
    if name not in _MODELS:
        from fake_models import make_model
        _MODELS[name] = make_model(name)
    return _MODELS[name]


def sim_figures(modes, requests, repeat) -> dict:
    """Steps/s per mode on the sim, one thread, unchecked and checked (best of ``repeat``)."""
    from invariants import make_checkers
    from overlapcheck.run import Case, Monitor, reference_run
    from overlapcheck.device import make_runtime
    torch.set_num_threads(1)

    def once(cfg, wl, ref, checked):
        rt = make_runtime("sim", seed=0, strategy="random", detect=checked, access="declared")
        mon = Monitor(make_checkers((), reference=ref)) if checked else None
        eng = make_engine(cfg, rt, model("oracle"), mon)
        t = time.perf_counter()
        res = eng.run(wl)
        dt = time.perf_counter() - t
        return dt, res.summary, len(mon.finish()) if mon else 0

    out = {}
    for name, kw in modes.items():
        try:
            cfg = dataclasses.replace(EngineConfig(), **kw)
        except ValueError as e:
            out[name] = {"skipped": str(e)}
            continue
        once(cfg, generate(0, 2, cfg), None, False)      # one-time costs out of the figures
        wl = generate(0, requests, cfg)
        ref = reference_run(Case(cfg, wl))
        rec = {}
        for label, checked in (("unchecked", False), ("checked", True)):
            dt, s, bad = min((once(cfg, wl, ref, checked) for _ in range(repeat)), key=lambda x: x[0])
            rec[label] = {"steps_per_s": s.steps / dt, "tokens_per_s": s.tokens / dt, "steps": s.steps,
                          "violations": bad}
        rec["checked_ratio"] = rec["checked"]["steps_per_s"] / rec["unchecked"]["steps_per_s"]
        out[name] = rec
    return out


def throughput(device, modes, model_name, batches, steps, settle, repeat, windows=4, tol=0.03,
               warmup_rounds=4) -> dict:
    """Steady decode tokens/s per mode (and non-overlap), bench/gpu_overlap.py's method
    (docs/design.md §8.1): a fixed timed range per run, warm-up rounds until settled,
    the measured rounds together with their windows taking turns, each round's rate
    against the same windows of the other rounds, medians with their min-max; vs
    standard per round."""
    import gpu_overlap as G
    import steady
    variants = {n: kw for n, kw in modes.items() if "tp" not in kw}
    variants["non-overlap"] = {"overlap": False}
    args = argparse.Namespace(device=device, row_width=0, page_size=16, prompt=16, spec_steps=3,
                              draft="standalone", graphs=True, settle=settle, steps=steps,
                              windows=windows)
    m, out = model(model_name), {}

    for batch in batches:
        names, rec = [], out.setdefault(batch, {})
        for name, kw in variants.items():
            try:                                           # a config the mode rejects: skipped
                G.ModeRun(args, model_name, m, batch, name, steps=2, windows=1, overrides=kw).go()
                names.append(name)
            except ValueError as e:
                rec[name] = {"skipped": str(e)}

        def rounds_(orders):
            return G.lockstep(args, model_name, m, batch, orders, overrides=variants)
        warm = steady.warm_up(names, lambda order: rounds_([order])[0], tol, warmup_rounds, joint=True)
        runs = steady.together(names, repeat, rounds_)
        rates = {n: steady.by_position([r["window_tokens_per_s"] for r in rs], rs[0]["window_tokens"])
                 for n, rs in runs.items()}
        for name, rs in runs.items():
            rec[name] = {k: statistics.median(r[k] for r in rs) for k in
                         ("steps_per_s", "syncs_per_step", "declared_per_step")}
            rec[name]["tokens_per_s"] = statistics.median(rates[name])
            rec[name]["tokens_per_s_spread"] = steady.spread(rates[name])
            rec[name]["tokens_per_s_totals"] = steady.spread(r["tokens_per_s"] for r in rs)
            rec[name]["repeats_tokens_per_s"] = [round(x, 1) for x in rates[name]]
            sp = steady.paired_ratio(rates[name], rates["standard"])
            rec[name]["vs_standard"], rec[name]["vs_standard_spread"] = sp["median"], sp
        rec["_warm_up"] = warm
    return out


def print_figures(doc) -> None:
    from steady import fmt_spread
    if doc.get("sim_figures"):
        print("\nsim, oracle, one thread: steps/s (tokens/s)")
        print(f"{'mode':12s} {'unchecked':>18s} {'checked':>18s} {'checked/unch':>12s} {'viol':>5s}")
        for name, r in doc["sim_figures"].items():
            if "skipped" in r:
                print(f"{name:12s} skipped: {r['skipped']}")
                continue
            u, c = r["unchecked"], r["checked"]
            print(f"{name:12s} {u['steps_per_s']:8.1f} ({u['tokens_per_s']:7.1f}) {c['steps_per_s']:8.1f} "
                  f"({c['tokens_per_s']:7.1f}) {r['checked_ratio']:12.3f} {c['violations']:5d}")
    for batch, rec in (doc.get("throughput") or {}).items():
        print(f"\n{doc['device']}, {doc['args']['model']}, batch {batch}: steady decode")
        print(f"{'mode':12s} {'tokens/s median [min-max]':>27s} {'vs std [min-max]':>23s} {'steps/s':>8s} "
              f"{'syncs':>6s} {'declared':>8s}")
        w = rec.get("_warm_up")
        for name, v in rec.items():
            if name.startswith("_"):
                continue
            if "skipped" in v:
                print(f"{name:12s} skipped: {v['skipped']}")
                continue
            print(f"{name:12s} {fmt_spread(v['tokens_per_s_spread'], width=27)} "
                  f"{fmt_spread(v['vs_standard_spread'], '.3f', 23)} {v['steps_per_s']:8.1f} "
                  f"{v['syncs_per_step']:6.2f} {v['declared_per_step']:8.2f}"
                  )
        if w:
            print(f"  {w['rounds']} warm-up rounds{'' if w['settled'] else ' (not settled)'}; medians over "
                  f"{doc['args']['repeat']} rounds run together, their windows taking turns; a round's "
                  "rate: its windows against the same windows of the other rounds; vs std from each "
                  "round's pair")
