"""Overlap on a GPU (docs/design.md §8, cuda): overlap vs non-overlap decode throughput side by
side, host syncs per steady decode step, GPU busy fraction and checker overhead, per model
and batch size. Prints a table and writes ``gpu_overlap.json`` under ``--out``.

    python bench/gpu_overlap.py --device cuda --out bench-out     # several minutes on one H100
    python bench/gpu_overlap.py --device cuda --models trained --batch 8 --repeat 1 --profile
    python bench/gpu_overlap.py --device sim --models random:tiny-qwen3 --batch 2 --steps 2 \
        --windows 2 --min-seconds 0 --repeat 1 --prompt 3 --spec-steps 1 --page-size 4 --out /tmp/b

Method (docs/design.md §8.1). A workload of B requests that arrive together (short prompts,
one prefill batch, outputs to the row's end, no stop tokens) reaches steady decode once
every request is running; after ``--settle`` more steps, ``--windows`` windows of
``--steps`` steps are timed back to back and the run stops. The range is fixed per
config, so every mode and round times the same steps and commits the same tokens; where
the non-overlap run times it in under ``--min-seconds`` (a host-bound model), the
config's windows are lengthened to fit, and the row (``--row-width 0``) is sized to the
range. On a GPU the time is the device's, from events recorded on every stream at the
window boundaries: nothing drains the pipeline between windows (a synchronization there
would idle the GPU for a host step at every boundary). The collector is off over the
windows. Modes:
``overlap`` and ``non-overlap`` (no observer, race detector off), ``checked`` (every
default checker; parity against a non-overlap run a few steps longer; golden and
accept-oracle idle, as no golden model is built; the canary checkers idle for a model
whose KV has no tags; detector off) and
``checked+detector``. Warm-up rounds (one run of every mode each) go on until every mode's
rate agrees with its previous round's within ``--tol`` (2 to ``--warmup-rounds``); then
``--repeat`` measured rounds, the start order alternating (forward, backward, ...: ABBA
for two modes) so a drift over the session falls on every mode alike. The measured rounds
run at once (``--interleave repeats``, the default): a run per mode and round, their
windows taking turns, so a slow period of the host falls on every round alike and the
spread between rounds is the figure's own (``rounds``: one round after another, its
modes' windows taking turns; ``off``: one mode's run after another's). Each figure is the
median over the rounds with its min-max beside it; a ratio (overlap/non-overlap,
checked/unchecked) is the median of each round's own ratio, with their min-max. A round's
rate is its typical speed (``steady.by_position``): every round times the same steps, so
each window is set against the same window's median over the rounds, and a window that
one round alone ran slow (a stall of the host) does not move it; the plain totals stay
in the JSON (``_totals``) and beside the ratio. The card,
its driver and clocks (``torch.cuda``, ``nvidia-smi``) are printed at the start and the
end and kept in the JSON (``gpu``, ``gpu_end``).
Syncs per step: the runtime's count (``rt.syncs``; hidden = beyond the engine's declared
waits) and, on cuda, the real ones seen by ``torch.cuda.set_sync_debug_mode("warn")`` in a
separate untimed pass ("unseen": those the runtime did not issue itself, with their call
sites in the JSON); that pass also runs the profiler over the same steps the figure was
timed over (a step's attention grows with its context), and GPU busy = union of kernel
time per step / the timed pass's time per step. Host ms per step: the host's own work,
its clock over the windows less the time the runtime was blocked in device waits
(``rt.wait_s``), median [min-max] over the rounds; where a mode's rate moves with it
from round to round, the spread is the host's, not the GPU's. ``--profile`` writes a
profiler table of one steady step, both modes, where overlap/non-overlap is under
``--profile-below``.
On cuda, every mode replays the model calls from CUDA graphs (``--graphs on``, the
default; ``overlapcheck.device.graphs``; ``checked+detector`` feeds the detector from the
launches' declared accesses): a shape's first call warms
up, its second captures, the window only replays (the JSON has each mode's graph counts).
Without graphs a step of these models is thousands of ~1 us kernels, launch-bound on the
host, and overlap has no GPU time to hide host work behind.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import os
import statistics
import sys
import time

import torch

import gpu_observe as obs
import steady
from fake_models import make_model
from overlapcheck import engine as E
from overlapcheck.device import check_available, device_info
from overlapcheck.device import make_runtime
from overlapcheck.engine import EngineConfig
from overlapcheck.engine.drafts import DRAFT_KINDS
from overlapcheck.protocol import RequestSpec, Workload
from overlapcheck.protocol.types import RUNNING

# the run order of a round (backward every other round): each ratio's two modes next
# to each other (non-overlap|overlap, overlap|checked), so a slow period of the host
# falls on both runs of a pair more often than on one
MODES = (("non-overlap", False, False, False), ("overlap", True, False, False),
         ("checked", True, True, False), ("checked+detector", True, True, True))
build_engine = getattr(E, "make_engine", E.Engine)
INTERLEAVED = {"repeats": ", windows of every round and mode interleaved",
               "rounds": ", windows of a round's modes interleaved", "off": ""}


def _nop():
    pass


class _Done(Exception):
    """The timed window is over: the run stops here."""


class RowTooShort(Exception):
    """A request left steady decode before the timed range ended."""


class Window:
    """Wraps ``eng.step``: waits for steady decode and ``settle`` more steps, then times
    ``windows`` windows of ``steps`` steps each and stops the run (docs/design.md §8.1).
    The range is fixed: every mode and every round of a config times the same steps of
    the same workload, so they commit the same tokens at the same context lengths, and a
    figure differs from another only by time. ``hooks``: callables "start" (after the
    first sync), "end" (before the last sync) and "after" (after it).

    Back to back (``interleave`` off), nothing drains the pipeline between windows: on a
    GPU a window boundary records an event on every stream of the runtime (its time is
    the latest of them, when the work queued by then is done); the device is
    synchronized only before the first window and after the last, and the windows are
    read from the events then. Interleaved (``interleave`` on, ``lockstep``), the run
    pauses at the end of each window (``paused``) while other runs take theirs, and
    ``resume`` starts the next one from a synchronized device. The collector is off over
    the windows (``gc.collect`` runs before), as serving engines freeze it: a full
    collection in a window is a host stall of milliseconds that the window would charge
    to the mode."""

    def __init__(self, eng, device, n_req, settle, steps, windows=1, hooks=None,
                 interleave=False):
        if steps < 1 or windows < 1:
            raise ValueError("a timed range needs at least one window of one step")
        self.eng, self.device, self.n_req, self.settle, self.steps = eng, device, n_req, settle, steps
        self.windows, self.hooks, self.n, self.result = windows, hooks or {}, 0, None
        self.interleave, self.paused = interleave, False
        self.spans = []    # (counters at a window's start, at its end), one per window
        self._start = None
        self.gpu = device_info(device).gpu
        self._gc = gc.isenabled()
        self._step, eng.step = eng.step, self.step

    def sync(self):   # the sim runs eagerly: its device work is done at launch
        if self.gpu:
            torch.cuda.synchronize()

    def _events(self):
        """An event recorded now on each of the runtime's streams (None off the GPU)."""
        if not self.gpu:
            return None
        evs = []
        for s in self.eng.rt.streams:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record(s.raw)
            evs.append(ev)
        return evs

    def counters(self):
        e = self.eng
        return (time.perf_counter(), sum(len(r.output) for r in e.requests.values()), e.rt.syncs,
                getattr(e.worker, "declared_syncs", 0), self.n, self._events(), time.process_time(),
                e.rt.wait_s)

    def _seconds(self, a, b) -> float:
        """Seconds between two boundaries: on a GPU, from the device's events (the latest
        stream of each boundary; the device was synchronized since), else the host's clock."""
        if a[5] is None:
            return b[0] - a[0]
        ref = self.spans[0][0][5][0]
        return (max(ref.elapsed_time(ev) for ev in b[5])
                - max(ref.elapsed_time(ev) for ev in a[5])) / 1e3

    def steady(self) -> bool:
        reqs = self.eng.requests.values()
        return len(reqs) == self.n_req and all(r.state == RUNNING for r in reqs)

    def resume(self) -> None:
        """Start the next window of an interleaved run, from a synchronized device."""
        self.sync()
        self.paused = False
        self._start = self.counters()

    def step(self):
        if self.result is None and self.n == 0 and self._start is None and self.steady():
            self.settle -= 1
            if self.settle < 0:
                self.sync()
                if self._gc:
                    gc.disable()
                self.hooks.get("start", _nop)()
                self._start = self.counters()
        self._step()
        if self.result is None and self._start is not None:
            self.n += 1
            if self.n % self.steps == 0:
                last = self.n == self.steps * self.windows
                if last:
                    self.hooks.get("end", _nop)()
                end = self.counters()
                self.spans.append((self._start, end))
                if last:
                    return self.finish()
                if self.interleave:
                    self.paused = True
                else:
                    self._start = end
            if not self.steady():
                self.sync()
                if self._gc:
                    gc.enable()
                raise RowTooShort(f"a request left steady decode {self.n} steps into a timed "
                                  f"range of {self.steps * self.windows}")

    def finish(self):
        """The figures over the whole range (the sums of its windows), and each
        window's rate."""
        self.sync()
        if not self.gpu:   # the host clock after the sync (the sim's work is done)
            a, b = self.spans[-1]
            self.spans[-1] = (a, (time.perf_counter(),) + b[1:])
        self.hooks.get("after", _nop)()
        if self._gc:
            gc.enable()
        secs = [max(self._seconds(a, b), 1e-12) for a, b in self.spans]
        dt = sum(secs)

        def total(i):
            return sum(b[i] - a[i] for a, b in self.spans)
        tokens, n = total(1), total(4)
        self.result = {"steps": n, "seconds": dt, "tokens": tokens,
                       "tokens_per_s": tokens / dt, "steps_per_s": n / dt,
                       "syncs_per_step": total(2) / n,
                       "declared_per_step": total(3) / n, "windows": len(secs),
                       "host_cpu_ms_per_step": total(6) * 1e3 / n,
                       # the host's own work: its clock less the time it was blocked in
                       # device waits (its CPU time would count the spin in them)
                       "host_ms_per_step": (total(0) - total(7)) * 1e3 / n,
                       "window_tokens_per_s": [round((b[1] - a[1]) / t, 1)
                                               for (a, b), t in zip(self.spans, secs)],
                       "window_tokens": [b[1] - a[1] for a, b in self.spans]}
        raise _Done


def auto_row_width(args) -> int:
    """A row long enough that no request leaves steady decode before the parity
    reference's range ends (it runs 3 steps past the timed range): every step may
    commit ``spec_steps + 1`` tokens; a few steps of slack for the prefill."""
    steps = args.settle + args.steps * args.windows + 3 + 4
    row = args.prompt + (args.spec_steps + 1) * steps + args.spec_steps + 1 + 8   # + the draft margin
    return -(-row // args.page_size) * args.page_size


def make_case(name, model, batch, args, overlap):
    row = args.row_width or auto_row_width(args)
    cfg = EngineConfig(page_size=args.page_size, pool_tokens=(batch + 1) * row, row_width=row,
                       max_running=batch, chunk_size=batch * args.prompt, spec_steps=args.spec_steps,
                       draft_kind=args.draft, model=name, overlap=overlap)
    vocab = min(getattr(model, "vocab", 64), 64)
    new = cfg.max_context - args.prompt    # no request finishes before the window ends
    reqs = tuple(RequestSpec(i, 0, tuple((7 * i + 3 * j + 1) % vocab for j in range(args.prompt)),
                             new, (), i) for i in range(batch))
    return cfg, Workload(reqs)


def make_monitor(ref, model):
    """Every default checker, as a run of the reference target gets them: parity's
    reference, and whether ``model``'s KV has the canary's tags."""
    from invariants import make_checkers
    from overlapcheck.engine.canary import tag_columns
    from overlapcheck.run import Monitor
    return Monitor(make_checkers((), reference=ref, kv_tags=tag_columns(model) is not None))


class ModeRun:
    """One run of ``mode`` on the config's workload, up to the end of its timed range:
    ``go`` runs it through (``Engine.run``); ``window`` steps it through its next window
    only, for ``lockstep``."""

    def __init__(self, args, name, model, batch, mode, ref=None, hooks=None, steps=None,
                 windows=None, settle=None, interleave=False, overrides=None):
        known = {m[0]: m[1:] for m in MODES}
        if mode not in known and overrides is None:
            raise ValueError(f"unknown mode {mode!r}")
        # another engine mode (bench/modes.py): overlap, unchecked, then ``overrides``
        overlap, checked, detect = known.get(mode, (True, False, False))
        self.label = f"{name} B={batch} {mode}"
        cfg, self.wl = make_case(name, model, batch, args, overlap)
        if overrides:
            cfg = dataclasses.replace(cfg, **overrides)
        if not interleave:
            gc.collect()
        graphs = args.graphs and device_info(args.device).gpu
        rt = make_runtime(args.device, seed=0, strategy="eager", detect=detect,
                          access="declared", graphs=graphs)
        self.mon = make_monitor(ref, model) if checked else None
        self.eng = build_engine(cfg, rt, model, self.mon)
        self.w = Window(self.eng, args.device, batch, args.settle if settle is None else settle,
                        steps or args.steps, args.windows if windows is None else windows, hooks,
                        interleave)
        self._fed = False

    def _stopped(self, e: BaseException) -> None:
        """A run that stopped before its range ended: a one-line exit."""
        from overlapcheck.run import Halt
        if isinstance(e, RowTooShort):
            raise SystemExit(f"{self.label}: {e} (raise --row-width, or leave it 0: auto)")
        if isinstance(e, Halt) and not self.w.result:   # a fatal checker stopped the run
            raise SystemExit(f"{self.label}: stopped before its window: {e}")

    def go(self):
        """Run to the end of the range: (the figures, the engine)."""
        from overlapcheck.run import Halt
        try:
            self.eng.run(self.wl)
        except _Done:
            pass
        except (RowTooShort, Halt) as e:
            self._stopped(e)
        finally:
            if self.w._gc:
                gc.enable()
        return self.figures(), self.eng

    def window(self) -> None:
        """Step through the next window (the first one after the warm-up steps), or to
        the end of the range."""
        from overlapcheck.run import Halt
        if not self._fed:      # every request arrives at step 0 (``make_case``)
            for spec in self.wl.requests:
                self.eng.add(spec)
            self._fed = True
        elif self.w.paused:
            self.w.resume()
        bound = 4 * sum(len(s.prompt) + s.max_new_tokens for s in self.wl.requests) + 50
        try:
            while self.w.result is None and not self.w.paused:
                if self.eng.iteration > bound:
                    raise SystemExit(f"{self.label}: no steady decode after {bound} steps")
                self.eng.step()
        except _Done:
            pass
        except (RowTooShort, Halt) as e:
            self._stopped(e)

    def figures(self) -> dict:
        if not self.w.result:
            raise SystemExit(f"{self.label}: the run ended before its timed range "
                             "(raise --row-width, or leave it 0: auto)")
        out = dict(self.w.result)
        cache = getattr(getattr(self.eng.worker, "model", None), "cache", None)
        if cache is not None:
            out["graphs"] = cache.stats.to_json()
        if self.mon is not None:   # so far: the run stops at the end of its window
            out["violations"] = [str(v).splitlines()[0] for v in self.mon.violations][:5]
        return out


def run_mode(args, name, model, batch, mode, ref=None, hooks=None, steps=None, windows=None,
             settle=None):
    """One run of ``mode`` up to the end of its timed range: (the figures, the engine)."""
    return ModeRun(args, name, model, batch, mode, ref, hooks, steps, windows, settle).go()


def lockstep(args, name, model, batch, orders, ref=None, overrides=None) -> list:
    """Rounds of modes (one order each in ``orders``) with their windows taking turns
    (``steady.take_turns``; docs/design.md §8.1): a run per mode of every round, all
    alive at once, each window from a synchronized device, the collector off.
    ``overrides``: {mode: EngineConfig fields} for ``ModeRun``. [{mode: figures}, one per
    round]."""
    gc_on = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        return steady.take_turns(
            orders, lambda m: ModeRun(args, name, model, batch, m, ref, interleave=True,
                                      overrides=(overrides or {}).get(m)), args.windows)
    finally:
        if gc_on:
            gc.enable()


def plan(args, name, model, batch):
    """The config's timed range and its parity reference (docs/design.md §8.1). The
    reference, a non-overlap run 3 steps past the range, also times the range; where
    that took under ``--min-seconds`` (a host-bound model: short windows are mostly
    jitter), the windows are lengthened to fit it and the reference is run again.
    Returns (args for this config, the reference's ``RunResult``)."""
    cargs = argparse.Namespace(**vars(args))

    def reference():
        got, eng = run_mode(cargs, name, model, batch, "non-overlap",
                            steps=cargs.steps * cargs.windows + 3, windows=1)
        return got, eng.result()
    got, ref = reference()
    per_step = got["seconds"] / got["steps"]
    want = math.ceil(args.min_seconds / per_step / args.windows) if args.min_seconds else 0
    if want > cargs.steps:
        cargs.steps = want
        got, ref = reference()
    return cargs, ref


def measure(args, name, model, batch) -> dict:
    """docs/design.md §8.1: warm-up rounds until every mode's rate settles, then
    ``--repeat`` rounds in balanced order; medians with their min-max spread."""
    args, ref = plan(args, name, model, batch)
    modes = [m[0] for m in MODES if m[0] in args.modes]

    def run(mode):
        return run_mode(args, name, model, batch, mode, ref)[0]

    def run_round(order):
        return lockstep(args, name, model, batch, [order], ref)[0]

    def run_all(orders):
        return lockstep(args, name, model, batch, orders, ref)
    rec = {"model": name, "batch": batch, "modes": {}, "window_steps": args.steps,
           "windows": args.windows, "row_width": args.row_width or auto_row_width(args),
           "interleave": args.interleave}
    joint = args.interleave != "off"
    how = run_round if joint else run
    rec["warm_up"] = steady.warm_up(modes, how, args.tol, args.warmup_rounds, joint=joint)
    if args.interleave == "repeats":
        runs = steady.together(modes, args.repeat, run_all)
    else:
        runs = steady.rounds(modes, args.repeat, how, joint=joint)
    # a round's rate: its windows against the same windows of the other rounds, the
    # host's stalls left out (docs/design.md §8.1, ``steady.by_position``); the plain
    # totals stay in the JSON (``_totals``)
    rates = {m: steady.by_position([r["window_tokens_per_s"] for r in rs], rs[0]["window_tokens"])
             for m, rs in runs.items()}
    for mode, rs in runs.items():
        med = {k: statistics.median(r[k] for r in rs) for k in
               ("steps_per_s", "syncs_per_step", "declared_per_step",
                "host_cpu_ms_per_step", "host_ms_per_step")}
        med["tokens_per_s"] = statistics.median(rates[mode])
        med["hidden_per_step"] = med["syncs_per_step"] - med["declared_per_step"]
        med["tokens_per_s_spread"] = steady.spread(rates[mode])
        med["tokens_per_s_totals"] = steady.spread(r["tokens_per_s"] for r in rs)
        med["host_ms_per_step_spread"] = steady.spread(r["host_ms_per_step"] for r in rs)
        med["repeats_host_ms_per_step"] = [round(r["host_ms_per_step"], 3) for r in rs]
        med["repeats_tokens_per_s"] = [round(x, 1) for x in rates[mode]]
        med["repeats_tokens_per_s_totals"] = [round(r["tokens_per_s"], 1) for r in rs]
        med["timed_steps"], med["timed_tokens"] = rs[0]["steps"], rs[0]["tokens"]
        med["window_tokens_per_s"] = [r["window_tokens_per_s"] for r in rs]
        med["window_tokens"] = rs[0]["window_tokens"]
        if any(r["window_tokens"] != rs[0]["window_tokens"] for r in rs):
            # by position assumes every round commits the same tokens window by window
            med["window_tokens_differ"] = [r["window_tokens"] for r in rs]
            print(f"note: {name} B={batch} {mode}: the rounds committed different tokens per "
                  "window (a nondeterministic run?); its rates by position weigh them as round 0's")
        if "graphs" in rs[0]:
            med["graphs"] = rs[0]["graphs"]
        if "violations" in rs[0]:
            med["violations"] = sorted({v for r in rs for v in r["violations"]})[:5]
        rec["modes"][mode] = med

    # each ratio of two modes from the rounds they shared (docs/design.md §8.1): each
    # round's a/b of the rates above, then their median and range; the JSON adds the
    # ratio of each round's totals (``_totals``) and, interleaved, the median of each
    # round's window pairs, the two windows of a pair run back to back (``_pairs``)
    for key, a, b in (("overlap_speedup", "overlap", "non-overlap"), ("checked_ratio", "checked", "overlap"),
                      ("checked_detector_ratio", "checked+detector", "overlap")):
        sp = totals = pairs = None
        if a in runs and b in runs:
            sp = steady.paired_ratio(rates[a], rates[b])
            totals = steady.paired_ratio([r["tokens_per_s"] for r in runs[a]],
                                         [r["tokens_per_s"] for r in runs[b]])
            if joint:
                pairs = steady.window_paired_ratio(*([r["window_tokens_per_s"] for r in runs[m]]
                                                     for m in (a, b)))
        rec[key], rec[key + "_spread"] = (sp["median"] if sp else None), sp
        rec[key + "_totals"], rec[key + "_pairs"] = totals, pairs
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
        # the steps the figure was timed over: contexts grow every step, and so does a
        # step's attention time
        watch, prof = obs.SyncWatch(), obs.profiler(args.device)
        got, _ = run_mode(args, name, model, batch, mode, hooks={
            "start": lambda: (prof.__enter__(), watch.__enter__()),
            "end": lambda: watch.__exit__(None, None, None),
            "after": lambda: prof.__exit__(None, None, None)})
        rec["real_syncs"][mode] = watch.report(got["steps"])
        per_step_s = 1.0 / rec["modes"][mode]["steps_per_s"]
        us, how = obs.kernel_busy_us(prof)
        short, long_ = obs.idle_gaps_us(prof)
        kern = us / 1e6 / got["steps"]
        rec["gpu_busy"][mode] = {"kernel_ms_per_step": round(kern * 1e3, 3), "method": how,
                                 "busy": round(min(1.0, kern / per_step_s), 3),
                                 "busy_in_profiled_pass": round(min(1.0, kern * got["steps"] / got["seconds"]), 3),
                                 "idle_ms_per_step": {"seams_under_10us": round(short / 1e3 / got["steps"], 3),
                                                      "longer": round(long_ / 1e3 / got["steps"], 3)}}


def profile_one_step(args, name, model, batch, mode) -> str:
    prof = obs.profiler(args.device)
    run_mode(args, name, model, batch, mode, steps=1, windows=1, hooks={"start": prof.__enter__,
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
        print(f"{r['model']:20s} {r['batch']:3d} {mode:17s} "
              f"{steady.fmt_spread(m['tokens_per_s_spread'], width=27)} "
              f"{m['steps_per_s']:8.1f} {m['syncs_per_step']:6.2f} {m['hidden_per_step']:6.2f} "
              f"{fmt(real.get('unseen_per_step')):>6s} {fmt(busy.get('busy')):>5s} "
              f"{steady.fmt_spread(m['host_ms_per_step_spread'], '.2f', width=18)}"
              + (f"  violations: {len(m['violations'])}" if m.get("violations") else "")

              + (f"  graph captures failed: {m['graphs']['failed']}"
                 if m.get("graphs", {}).get("failed") else ""))
    w = r["warm_up"]
    print(f"{'':24s} ({r['seconds']} s, {r['windows']} windows of {r['window_steps']} steps, "
          f"row {r['row_width']}, {w['rounds']} warm-up rounds"
          + (f", peak {r['gpu_peak_gib']} GiB" if "gpu_peak_gib" in r else "") +
          f"{'' if w['settled'] else ', not settled'}) overlap/non-overlap "
          f"{steady.fmt_spread(r['overlap_speedup_spread'], '.3f')}x "
          f"(totals {steady.fmt_spread(r['overlap_speedup_totals'], '.3f')}x), "
          f"checked/unchecked {steady.fmt_spread(r['checked_ratio_spread'], '.3f')}, "
          f"with detector {steady.fmt_spread(r['checked_detector_ratio_spread'], '.3f')}")
    for p in r.get("profiles", {}).values():
        print(f"{'':24s} profile: {p}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "sim"))
    ap.add_argument("--models", default="trained,random:llama-1b", help="comma-separated")
    ap.add_argument("--batch", default="1,8,32", help="comma-separated batch sizes")
    ap.add_argument("--modes", default=",".join(m[0] for m in MODES), help="comma-separated")
    ap.add_argument("--steps", type=int, default=6,
                    help="steady steps per timed window (at least; see --min-seconds)")
    ap.add_argument("--windows", type=int, default=8,
                    help="timed windows per run (interleaved: each paired with the other "
                         "modes' window of the same position)")
    ap.add_argument("--min-seconds", type=float, default=1.0,
                    help="lengthen a config's windows until its non-overlap run times at least "
                         "this long (0: never)")
    ap.add_argument("--settle", type=int, default=3, help="steady steps before the first window")
    ap.add_argument("--tol", type=float, default=0.03,
                    help="warm-up: rounds until each mode agrees with its previous round within this")
    ap.add_argument("--warmup-rounds", type=int, default=4,
                    help="cap on warm-up rounds (every mode, until each mode's rate agrees with its "
                         "previous round's within --tol; at least 2)")
    ap.add_argument("--repeat", type=int, default=6, help="measured rounds (even: balanced order)")
    ap.add_argument("--interleave", default="repeats", choices=("repeats", "rounds", "off"),
                    help="repeats: every measured round's runs of every mode at once, their "
                         "windows taking turns; rounds: one round at a time, its modes' windows "
                         "taking turns; off: one mode's run after the other's")
    ap.add_argument("--prompt", type=int, default=16, help="prompt tokens per request")
    ap.add_argument("--row-width", type=int, default=0,
                    help="context per request (0: just long enough for the timed range)")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--spec-steps", type=int, default=3)
    ap.add_argument("--draft", default="standalone", choices=tuple(DRAFT_KINDS))
    ap.add_argument("--graphs", default="on", choices=("on", "off"),
                    help="cuda: replay the model calls from CUDA graphs (the detector takes "
                         "declared accesses)")
    obs.add_pdl_arg(ap)
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
    if bad or not args.models or not args.batch or min(args.batch) < 1 or args.steps < 1 or \
            args.repeat < 1 or args.windows < 1 or args.tol <= 0 or args.min_seconds < 0 or \
            args.settle < 0 or args.row_width < 0:
        ap.error(f"bad --modes/--models/--batch/--steps/--windows/--settle/--tol/--min-seconds/"
                 f"--row-width (modes: {', '.join(x[0] for x in MODES)})")
    try:
        check_available(args.device)
    except RuntimeError as e:
        ap.error(str(e))
    info = device_info(args.device)
    args.pdl = obs.apply_pdl(ap, args.pdl, args.device)
    if info.cpu_work:
        torch.set_num_threads(1)   # small CPU ops: threads only add overhead
    # interleaved, a round's modes take turns backward on odd windows, so an even
    # --windows balances every round on its own; back to back only an even --repeat does
    if args.repeat % 2 and (args.interleave == "off" or args.windows % 2):
        print(f"note: --repeat {args.repeat} is odd"
              + ("" if args.interleave == "off" else f" and so is --windows {args.windows}")
              + ": the start order is not balanced")
    os.makedirs(args.out, exist_ok=True)
    t0 = time.perf_counter()
    doc = {"device": args.device, "gpu": obs.gpu_info(args.device),
           "torch": torch.__version__, "args": {k: v for k, v in vars(args).items()}, "configs": []}
    print(obs.gpu_line(doc["gpu"]) + (f", dependent launch {'on' if args.pdl else 'off'}"
                                      if info.gpu else ""))
    print(f"{'model':20s} {'B':>3s} {'mode':17s} {'tokens/s median [min-max]':>27s} {'steps/s':>8s} {'syncs':>6s} "
          f"{'hidden':>6s} {'unseen':>6s} {'busy':>5s} {'host ms [min-max]':>18s}")
    print("  per steady step: syncs = the runtime's count, hidden = beyond the declared waits, "
          "unseen = real syncs (sync-debug) the runtime did not issue; busy = GPU kernel time / wall;\n"
          "  host ms = the host's own work per step (its clock less its waits on the device): "
          "a mode's spread that follows it is the host's;\n"
          f"  {args.repeat} rounds per figure (order alternating"
          f"{INTERLEAVED[args.interleave]}), medians [min-max]; a round's tokens/s: its windows "
          "against the same windows of the other rounds (the host's stalls left out);\n"
          "  ratios from each round's pair; totals: the same from each round's plain totals")
    for name in args.models:
        t = time.perf_counter()
        model = make_model(name)
        for batch in args.batch:
            if info.gpu:
                torch.cuda.reset_peak_memory_stats()
            rec = measure(args, name, model, batch)
            rec["seconds"] = round(time.perf_counter() - t, 1)   # the first one includes model set-up
            if info.gpu:   # every round's runs alive at once (--interleave repeats) hold this
                rec["gpu_peak_gib"] = round(torch.cuda.max_memory_allocated() / 2 ** 30, 2)
            t = time.perf_counter()
            doc["configs"].append(rec)
            print_rec(rec)
            with open(os.path.join(args.out, "gpu_overlap.json"), "w") as fh:
                json.dump(doc, fh, indent=1)
    doc["seconds"] = round(time.perf_counter() - t0, 1)
    doc["gpu_end"] = obs.gpu_info(args.device)
    if doc["gpu_end"]:
        print("at the end: " + obs.gpu_line(doc["gpu_end"]))
    with open(os.path.join(args.out, "gpu_overlap.json"), "w") as fh:
        json.dump(doc, fh, indent=1)
    print(f"done in {doc['seconds']} s; figures in {os.path.join(args.out, 'gpu_overlap.json')}")


if __name__ == "__main__":
    main()
