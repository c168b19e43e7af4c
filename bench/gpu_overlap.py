"""Overlap on a GPU (docs/design.md §8, cuda): overlap vs non-overlap decode throughput side by
side, host syncs per steady decode step, GPU busy fraction and checker overhead, per model
and batch size. Prints a table and writes ``gpu_overlap.json`` under ``--out``.

    python bench/gpu_overlap.py --device cuda --out bench-out     # 2-3 min on one H100
    python bench/gpu_overlap.py --device cuda --models trained --batch 8 --repeat 1 --profile
    python bench/gpu_overlap.py --device sim --models random:tiny-qwen3 --batch 2 --steps 2 \
        --repeat 1 --row-width 24 --prompt 3 --spec-steps 1 --page-size 4 --out /tmp/b   # smoke

Method. A workload of B requests that arrive together (short prompts, one prefill batch,
outputs to the row's end, no stop tokens) reaches steady decode once every request is
running; after ``--settle`` more steps a window of ``--steps`` steps is timed between two
device synchronizations (tokens/s = tokens committed in the window / its wall time) and the
run stops. Modes: ``overlap`` and ``non-overlap`` (no observer, race detector off),
``checked`` (every checker; parity against a non-overlap run a few steps longer; detector
off) and ``checked+detector``. After a warm-up run per mode, each is repeated ``--repeat``
times, interleaved; medians are reported, with the violations checked runs saw (a real-size
model's step is ~20k eager ops: the default window is short so the default run stays short).
Syncs per step: the runtime's count (``rt.syncs``; hidden = beyond the engine's declared
waits) and, on cuda, the real ones seen by ``torch.cuda.set_sync_debug_mode("warn")`` in a
separate untimed pass ("unseen": those the runtime did not issue itself, with their call
sites in the JSON); that pass also runs the profiler, and GPU busy = union of kernel time
per step / the timed pass's wall time per step. ``--profile`` writes a profiler table of one
steady step, both modes, where overlap/non-overlap is under ``--profile-below``.
On cuda, every mode but ``checked+detector`` replays the model calls from CUDA graphs
(``--graphs on``, the default; ``overlapcheck.device.graphs``): a shape's first call warms
up, its second captures, the window only replays (the JSON has each mode's graph counts).
Without graphs a step of these models is thousands of ~1 us kernels, launch-bound on the
host, and overlap has no GPU time to hide host work behind.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time

import torch

import gpu_observe as obs
from fake_models import make_model
from overlapcheck import engine as E
from overlapcheck.device import check_available, device_info
from overlapcheck.device import make_runtime
from overlapcheck.engine import EngineConfig, RequestSpec, Workload
from overlapcheck.engine.types import RUNNING
from overlapcheck.engine.drafts import DRAFT_KINDS

MODES = (("overlap", True, False, False), ("non-overlap", False, False, False),
         ("checked", True, True, False), ("checked+detector", True, True, True))
build_engine = getattr(E, "make_engine", E.Engine)


def _nop():
    pass


class _Done(Exception):
    """The timed window is over: the run stops here."""


class Window:
    """Wraps ``eng.step``: waits for steady decode, then times ``steps`` steps between two
    device synchronizations. ``hooks``: callables "start" (after the first sync), "end"
    (before the last sync) and "after" (after it)."""

    def __init__(self, eng, device, n_req, settle, steps, hooks=None):
        self.eng, self.device, self.n_req, self.settle, self.steps = eng, device, n_req, settle, steps
        self.hooks, self.n, self.result = hooks or {}, 0, None
        self._step, eng.step = eng.step, self.step

    def sync(self):   # the sim runs eagerly: its device work is done at launch
        if device_info(self.device).gpu:
            torch.cuda.synchronize()

    def counters(self):
        e = self.eng
        return (time.perf_counter(), sum(len(r.output) for r in e.requests.values()), e.rt.syncs,
                getattr(e.worker, "declared_syncs", 0))

    def steady(self) -> bool:
        reqs = self.eng.requests.values()
        return len(reqs) == self.n_req and all(r.state == RUNNING for r in reqs)

    def step(self):
        if self.result is None and self.n == 0 and self.steady():
            self.settle -= 1
            if self.settle < 0:
                self.sync()
                self.hooks.get("start", _nop)()
                self.start = self.counters()
        self._step()
        if self.result is None and self.settle < 0:
            self.n += 1
            if self.n >= self.steps or not self.steady():
                end = self.counters()
                self.hooks.get("end", _nop)()
                self.sync()
                t1 = time.perf_counter()
                self.hooks.get("after", _nop)()
                dt, n = t1 - self.start[0], self.n
                self.result = {"steps": n, "seconds": dt, "tokens_per_s": (end[1] - self.start[1]) / dt,
                               "steps_per_s": n / dt, "syncs_per_step": (end[2] - self.start[2]) / n,
                               "declared_per_step": (end[3] - self.start[3]) / n}
                raise _Done


def make_case(name, model, batch, args, overlap):
    row = args.row_width
    cfg = EngineConfig(page_size=args.page_size, pool_tokens=(batch + 1) * row, row_width=row,
                       max_running=batch, chunk_size=batch * args.prompt, spec_steps=args.spec_steps,
                       draft_kind=args.draft, model=name, overlap=overlap)
    vocab = min(getattr(model, "vocab", 64), 64)
    new = cfg.max_context - args.prompt    # no request finishes before the window ends
    reqs = tuple(RequestSpec(i, 0, tuple((7 * i + 3 * j + 1) % vocab for j in range(args.prompt)),
                             new, (), i) for i in range(batch))
    return cfg, Workload(reqs)


def make_monitor(ref):
    from invariants import make_checkers
    from overlapcheck.run import Monitor
    return Monitor(make_checkers((), reference=ref))


def run_mode(args, name, model, batch, mode, ref=None, hooks=None, steps=None):
    """One run of ``mode`` up to the end of its window: (the window's figures, the engine)."""
    from overlapcheck.run import Halt
    _, overlap, checked, detect = next(m for m in MODES if m[0] == mode)
    cfg, wl = make_case(name, model, batch, args, overlap)
    gc.collect()
    graphs = args.graphs and device_info(args.device).gpu and not detect
    rt = make_runtime(args.device, seed=0, strategy="eager", detect=detect, access="declared",
                      graphs=graphs)
    mon = make_monitor(ref) if checked else None
    eng = build_engine(cfg, rt, model, mon)
    w = Window(eng, args.device, batch, args.settle, steps or args.steps, hooks)
    try:
        eng.run(wl)
    except _Done:
        pass
    except Halt as h:   # a fatal checker stopped the run
        if not w.result:
            raise SystemExit(f"{name} B={batch} {mode}: stopped before its window: {h}")
    if not w.result:
        raise SystemExit(f"{name} B={batch} {mode}: no steady decode window (raise --row-width?)")
    out = dict(w.result)
    cache = getattr(getattr(eng.worker, "model", None), "cache", None)
    if cache is not None:
        out["graphs"] = cache.stats.to_json()
    if mon is not None:   # so far: the run stops at the end of its window
        out["violations"] = [str(v).splitlines()[0] for v in mon.violations][:5]
    return out, eng


def measure(args, name, model, batch) -> dict:
    # warm-up, and the parity reference: non-overlap, a few steps past the others' windows
    ref = run_mode(args, name, model, batch, "non-overlap", steps=args.steps + 3)[1].result()
    runs = {m[0]: [] for m in MODES if m[0] in args.modes}
    for mode in runs:                                          # first-time costs of each mode
        run_mode(args, name, model, batch, mode, ref, steps=2)
    for _ in range(args.repeat):
        for mode in runs:
            runs[mode].append(run_mode(args, name, model, batch, mode, ref)[0])
    rec = {"model": name, "batch": batch, "modes": {}}
    for mode, rs in runs.items():
        med = {k: statistics.median(r[k] for r in rs) for k in
               ("tokens_per_s", "steps_per_s", "syncs_per_step", "declared_per_step")}
        med["hidden_per_step"] = med["syncs_per_step"] - med["declared_per_step"]
        med["repeats_tokens_per_s"] = [round(r["tokens_per_s"], 1) for r in rs]
        med["window_steps"] = rs[0]["steps"]
        if "graphs" in rs[0]:
            med["graphs"] = rs[0]["graphs"]
        if "violations" in rs[0]:
            med["violations"] = sorted({v for r in rs for v in r["violations"]})[:5]
        rec["modes"][mode] = med
    m = rec["modes"]

    def ratio(a, b):
        return m[a]["tokens_per_s"] / m[b]["tokens_per_s"] if a in m and b in m and \
            m[b]["tokens_per_s"] > 0 else None
    rec["overlap_speedup"] = ratio("overlap", "non-overlap")
    rec["checked_ratio"] = ratio("checked", "overlap")
    rec["checked_detector_ratio"] = ratio("checked+detector", "overlap")
    observe(args, name, model, batch, rec)
    return rec


def observe(args, name, model, batch, rec):
    """Untimed pass per unchecked mode (cuda): real syncs and kernel time; a profile
    table of one step where the speedup is low and ``--profile`` asks for it."""
    rec["real_syncs"], rec["gpu_busy"], rec["profiles"] = {}, {}, {}
    low = rec["overlap_speedup"] is not None and rec["overlap_speedup"] < args.profile_below
    for mode in ("overlap", "non-overlap"):
        if mode not in rec["modes"]:
            continue
        if args.profile and low:
            rec["profiles"][mode] = profile_one_step(args, name, model, batch, mode)
        if not device_info(args.device).gpu:
            continue
        watch, prof = obs.SyncWatch(), obs.profiler(args.device)
        got, _ = run_mode(args, name, model, batch, mode, hooks={
            "start": lambda: (prof.__enter__(), watch.__enter__()),
            "end": lambda: watch.__exit__(None, None, None),
            "after": lambda: prof.__exit__(None, None, None)})
        rec["real_syncs"][mode] = watch.report(got["steps"])
        per_step_s = 1.0 / rec["modes"][mode]["steps_per_s"]
        us, how = obs.kernel_busy_us(prof)
        kern = us / 1e6 / got["steps"]
        rec["gpu_busy"][mode] = {"kernel_ms_per_step": round(kern * 1e3, 3), "method": how,
                                 "busy": round(min(1.0, kern / per_step_s), 3),
                                 "busy_in_profiled_pass": round(min(1.0, kern * got["steps"] / got["seconds"]), 3)}


def profile_one_step(args, name, model, batch, mode) -> str:
    prof = obs.profiler(args.device)
    run_mode(args, name, model, batch, mode, steps=1, hooks={"start": prof.__enter__,
                                                   "after": lambda: prof.__exit__(None, None, None)})
    path = os.path.join(args.out, f"profile-{name.replace(':', '_')}-b{batch}-{mode}.txt")
    with open(path, "w") as fh:
        fh.write(f"# {name} batch {batch} {mode}: one steady decode step (ends with a device sync)\n")
        fh.write(obs.table(prof, args.device) + "\n")
    return path


def fmt(x, spec=".2f"):
    return "-" if x is None else format(x, spec)


def print_rec(r):
    for mode, m in r["modes"].items():
        real = r.get("real_syncs", {}).get(mode, {})
        busy = r.get("gpu_busy", {}).get(mode, {})
        print(f"{r['model']:20s} {r['batch']:3d} {mode:17s} {m['tokens_per_s']:9.1f} "
              f"{m['steps_per_s']:8.1f} {m['syncs_per_step']:6.2f} {m['hidden_per_step']:6.2f} "
              f"{fmt(real.get('unseen_per_step')):>6s} {fmt(busy.get('busy')):>5s}"
              + (f"  violations: {len(m['violations'])}" if m.get("violations") else "")
              + (f"  graph captures failed: {m['graphs']['failed']}"
                 if m.get("graphs", {}).get("failed") else ""))
    print(f"{'':24s} ({r['seconds']} s) overlap/non-overlap {fmt(r['overlap_speedup'], '.3f')}x, "
          f"checked/unchecked {fmt(r['checked_ratio'], '.3f')}, "
          f"with detector {fmt(r['checked_detector_ratio'], '.3f')}")
    for p in r.get("profiles", {}).values():
        print(f"{'':24s} profile: {p}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "sim"))
    ap.add_argument("--models", default="trained,random:llama-1b", help="comma-separated")
    ap.add_argument("--batch", default="1,8,32", help="comma-separated batch sizes")
    ap.add_argument("--modes", default=",".join(m[0] for m in MODES), help="comma-separated")
    ap.add_argument("--steps", type=int, default=12, help="timed steady steps per run")
    ap.add_argument("--settle", type=int, default=3, help="steady steps before the window")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--prompt", type=int, default=16, help="prompt tokens per request")
    ap.add_argument("--row-width", type=int, default=256, help="context per request")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--spec-steps", type=int, default=3)
    ap.add_argument("--draft", default="standalone", choices=tuple(DRAFT_KINDS))
    ap.add_argument("--graphs", default="on", choices=("on", "off"),
                    help="cuda: replay the model calls from CUDA graphs (not with the detector)")
    ap.add_argument("--profile", action="store_true", help="profile tables where the speedup is low")
    ap.add_argument("--profile-below", type=float, default=1.10)
    ap.add_argument("--out", default="bench-out", help="folder for gpu_overlap.json and profiles")
    args = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    args.models = [m for m in args.models.split(",") if m]
    args.batch = [int(b) for b in args.batch.split(",") if b]
    args.modes = [m for m in args.modes.split(",") if m]
    args.graphs = args.graphs == "on"
    bad = [m for m in args.modes if m not in {x[0] for x in MODES}]
    if bad or not args.models or not args.batch or min(args.batch) < 1 or args.steps < 1:
        ap.error(f"bad --modes/--models/--batch/--steps (modes: {', '.join(x[0] for x in MODES)})")
    try:
        check_available(args.device)
    except RuntimeError as e:
        ap.error(str(e))
    info = device_info(args.device)
    if info.cpu_work:
        torch.set_num_threads(1)   # small CPU ops: threads only add overhead
    os.makedirs(args.out, exist_ok=True)
    t0 = time.perf_counter()
    doc = {"device": args.device, "gpu": torch.cuda.get_device_name() if info.gpu else None,
           "torch": torch.__version__, "args": {k: v for k, v in vars(args).items()}, "configs": []}
    print(f"{'model':20s} {'B':>3s} {'mode':17s} {'tokens/s':>9s} {'steps/s':>8s} {'syncs':>6s} "
          f"{'hidden':>6s} {'unseen':>6s} {'busy':>5s}")
    print("  per steady step: syncs = the runtime's count, hidden = beyond the declared waits, "
          "unseen = real syncs (sync-debug) the runtime did not issue; busy = GPU kernel time / wall")
    for name in args.models:
        t = time.perf_counter()
        model = make_model(name)
        for batch in args.batch:
            rec = measure(args, name, model, batch)
            rec["seconds"] = round(time.perf_counter() - t, 1)   # the first one includes model set-up
            t = time.perf_counter()
            doc["configs"].append(rec)
            print_rec(rec)
            with open(os.path.join(args.out, "gpu_overlap.json"), "w") as fh:
                json.dump(doc, fh, indent=1)
    doc["seconds"] = round(time.perf_counter() - t0, 1)
    with open(os.path.join(args.out, "gpu_overlap.json"), "w") as fh:
        json.dump(doc, fh, indent=1)
    print(f"done in {doc['seconds']} s; figures in {os.path.join(args.out, 'gpu_overlap.json')}")


if __name__ == "__main__":
    main()
