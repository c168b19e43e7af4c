"""``overlapcheck fuzz``: the main job.

With no flags: a one-minute campaign of the reference engine on the simulated device
with the oracle model, every checker on, repros written under
``overlapcheck-findings/``. ``--target vllm`` or ``--target sglang`` fuzzes that
engine's real scheduler instead. ``--time T`` ends by T seconds from the command's
start, start-up and shrinking included (``--shrink-time`` gives shrinking more).
``--db`` keeps the Hypothesis example database in a folder and/or on a Redis server a
fleet shares (``redis://HOST:PORT[/N]``); ``--ray ADDRESS`` runs the campaign's slices
on a Ray cluster (``docs/fleet.md``). Each finding is written when first seen and
replaced by smaller cases as Hypothesis shrinks it. Ctrl-C (or SIGTERM) stops the
campaign with its summary, a second one exits at once. Exit 0 when nothing was found,
1 when something was (or a Ray slice was lost), 2 on a usage error, 130 (143) when a
signal stopped a campaign that had found nothing.
"""
from __future__ import annotations

import json
import sys
import time


def register(sub) -> None:
    from .. import targets
    p = sub.add_parser("fuzz", help="fuzz an engine: the reference engine (the main job), "
                                    "vLLM or SGLang", description=__doc__)
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--time", type=float, metavar="SECONDS",
                        help="time budget (default 60 s unless --examples is given)")
    budget.add_argument("--examples", type=int, metavar="N", help="stop after N examples")
    p.add_argument("--seed", type=int, default=0, help="campaign seed (default 0)")
    from ..device import DEVICES
    p.add_argument("--device", default="sim", help=f"{', '.join(DEVICES)} (default sim)")
    p.add_argument("--cuda-graphs", action="store_true",
                   help="reference engine on a GPU device: replay the model calls from CUDA "
                        "graphs (the race detector takes the launches' declared accesses)")
    p.add_argument("--target", default="reference", metavar="NAME",
                   help=f"the engine to fuzz: {', '.join(targets.TARGETS)} (default reference)")
    p.add_argument("--model", default=None, help="reference engine: oracle (default), tiny, "
                                                 "trained, hf:DIR or random:NAME")
    p.add_argument("--draft", default=None, metavar="KIND",
                   help="reference engine: only this draft kind (default: every kind)")
    p.add_argument("--config", default=None, metavar="FILE.yaml",
                   help="a target's config fields to hold fixed (a YAML mapping, e.g. "
                        "worker: eagle-v2 for SGLang's real spec worker); the campaign draws "
                        "the others")
    p.add_argument("--check", default="", metavar="NAMES",
                   help="comma-separated checkers (default: all)")
    p.add_argument("--fault", action="append", default=[], metavar="NAME",
                   help="turn a fault of the target on (repeatable; overlapcheck faults "
                        "--target NAME lists them)")
    p.add_argument("--shrink-time", type=float, default=None, metavar="SECONDS",
                   help="with --time: seconds shrinking may run past the budget (default 0: "
                        "the smallest failing case found by then is kept); with --examples: "
                        "a cap on shrinking one finding (default: none)")
    p.add_argument("-j", "--jobs", type=int, default=None, metavar="N",
                   help="processes (default 1; at most this machine's CPUs); with --ray, slices "
                        "(default: the cluster's CPUs)")
    p.add_argument("--out", default="overlapcheck-findings", metavar="DIR",
                   help="where repros and traces go (default overlapcheck-findings)")
    p.add_argument("--db", action="append", default=None, metavar="DIR|redis://HOST:PORT[/N]",
                   help="Hypothesis example database: a folder, a Redis server shared by a "
                        "fleet (multiplexed with a local folder, .overlapcheck/hypothesis-db "
                        "unless a folder is given too), or both (default: none)")
    p.add_argument("--ray", default=None, metavar="ADDRESS",
                   help="run the campaign's slices on a Ray cluster: HOST:PORT, ray://HOST:PORT, "
                        "auto (the running cluster), or local:N (a local cluster of N workers)")
    p.add_argument("--known", action="append", default=[], metavar="REPRO|DIR",
                   help="findings already known (a repro file, or a folder of them; "
                        "repeatable): their (checker, site) is not reported again")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=run)


def _options(args):
    from .. import targets
    from ..errors import UsageError
    from ..protocol.target import TargetUnavailable
    from ..device import check_available, device_info
    from ..engine.drafts import DRAFT_KINDS
    try:
        target = targets.get(args.target)
    except ValueError as e:
        raise UsageError(str(e)) from None
    for flag, value, option in (("--model", args.model, "models"),
                                ("--draft", args.draft, "draft_kinds")):
        if value is not None and option not in target.case_options:
            raise UsageError(f"{flag} is not an option of target {args.target} (its engine "
                             f"runs its own fake model)")
    config = None
    if args.config is not None:
        if "config" not in target.case_options:
            raise UsageError(f"--config is not an option of target {args.target} (its "
                             f"campaign draws every config field)")
        from ..run.command import read_config
        config = tuple(sorted(read_config(args.config, target)[0].items()))
    for flag, value in (("--time", args.time), ("--shrink-time", args.shrink_time)):
        # nan compares false with everything: it would never end; a year is plenty
        if value is not None and not 0 < value <= MAX_SECONDS:
            raise UsageError(f"{flag} must be a positive number of seconds (at most "
                             f"{MAX_SECONDS:g}), got {value}")
    if args.examples is not None and args.examples < 1:
        raise UsageError(f"--examples must be at least 1, got {args.examples}")
    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"--jobs must be at least 1, got {args.jobs}")
    from .options import split_specs
    try:
        db, shared_db = split_specs(args.db)
    except ValueError as e:
        raise UsageError(f"--db: {e}") from None
    from ..outputs import output_folder
    if db:
        output_folder(db, "--db")
    if args.out:
        output_folder(args.out, "--out")
    if shared_db:
        _check_shared_db(shared_db)
    try:
        info = device_info(args.device)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.cuda_graphs and not (info.gpu and args.target == "reference"):
        raise UsageError(f"--cuda-graphs needs the reference engine on a GPU device, not "
                         f"{args.target} on {args.device}")
    kinds = None if args.draft is None else (args.draft,)
    if args.draft is not None and args.draft not in DRAFT_KINDS:
        raise UsageError(f"unknown draft kind {args.draft!r} (choose from {', '.join(DRAFT_KINDS)})")
    checks = tuple(x for x in args.check.split(",") if x)
    try:
        from invariants.base import check_names
        check_names(checks)
    except ValueError as e:
        raise UsageError(str(e)) from None
    faults = tuple(args.fault)
    _check_faults(faults, args.target)
    try:
        target.version()          # a missing or other-version engine: one line, exit 2
    except TargetUnavailable as e:
        raise UsageError(str(e)) from None
    if args.model is not None:
        try:   # builds the model once: a bad name or model directory is one line, exit 2
            from fake_models import make_model
            make_model(args.model)
        except ValueError as e:
            raise UsageError(str(e)) from None
    from .options import Options
    try:
        check_available(args.device)
    except RuntimeError as e:
        raise UsageError(str(e)) from None
    seconds = args.time if args.time is not None else (None if args.examples else 60.0)
    return Options(seconds=seconds, examples=args.examples, seed=args.seed, device=args.device,
                   target=args.target, models=(args.model,) if args.model else None,
                   draft_kinds=kinds, checks=checks, faults=faults,
                   out=args.out, db=db, shrink_seconds=args.shrink_time, shared_db=shared_db,
                   known=_known(args.known, args.target), started=_started(),
                   graphs=args.cuda_graphs, config=config)


def _started() -> float:
    """The command's start (the CLI module's import), where the time box begins."""
    from ..cli import STARTED
    return STARTED


def _known(paths, target: str) -> frozenset:
    """The (checker, site) keys of the repros at ``paths`` (files or folders of
    ``*.yaml``), which must be repros of ``target``; a bad file is a usage error."""
    import glob
    import os
    from ..errors import UsageError
    from ..repro.format import ReproError, load
    keys = set()
    for path in paths:
        files = sorted(glob.glob(os.path.join(path, "*.yaml"))) if os.path.isdir(path) else [path]
        if not files:
            raise UsageError(f"--known {path}: no repro files (*.yaml) there")
        for f in files:
            try:
                r = load(f)
            except ReproError as e:
                raise UsageError(f"--known: {e}") from None
            if r.case.target != target:
                raise UsageError(f"--known {f}: a repro of target {r.case.target}, not {target}")
            keys.add(r.finding.key)
    return frozenset(keys)


def _check_faults(faults, target: str = "reference") -> None:
    from ..errors import UsageError
    from .. import targets
    try:
        targets.get(target).check_faults(faults)
    except ValueError as e:
        raise UsageError(str(e)) from None


MAX_SECONDS = 365 * 86400.0


def _jobs(args) -> int:
    """``-j N`` on this machine: at most its CPUs (more processes only share them, and
    each spends part of the time box starting), said once."""
    from ..resources import cpus
    jobs = args.jobs or 1
    if args.ray is None and jobs > cpus():
        print(f"fuzz: -j {jobs} capped at {cpus()}, this machine's CPUs", file=sys.stderr)
        jobs = cpus()
    return jobs


class _StartUpTookTheBox(BaseException):
    """Raised in the main thread by the start-up watchdog (``_StartUpWatch``). Not an
    ``Exception``: it may land inside an import or a library's ``except Exception``
    (an optional dependency's probe), which must not swallow it."""


class _StartUpWatch:
    """The time box holds while the campaign is still starting: imports, the fork
    server, the engine's own start on a loaded machine can take longer than a short
    box. An interval timer fires at the box's end; if the campaign has not begun by
    then (it keeps the box itself once it runs), start-up stops there and the command
    says so, with nothing found and nothing lost. Disarmed as the campaign begins. The
    flags are checked first: a box that ends while they are is kept until they are
    (``checked``), so a usage error is never hidden by a short box."""

    def __init__(self, args) -> None:
        import signal
        self.armed = self.ready = self.expired = False
        self.checked_at = None
        if any(v is not None and not 0 < v <= MAX_SECONDS for v in (args.time, args.shrink_time)) \
                or args.time is None or not hasattr(signal, "setitimer"):
            return          # no box, or a bad one (the flags' check says so)
        left = _started() + args.time + (args.shrink_time or 0.0) - time.monotonic()
        self._saved = signal.signal(signal.SIGALRM, self._fire)
        signal.setitimer(signal.ITIMER_REAL, max(left, 0.001))
        self.armed = True

    def _fire(self, signum, frame) -> None:
        if self.armed:
            self.disarm()
            if not self.ready:
                self.expired = True     # said once the flags are checked
                return
            raise _StartUpTookTheBox()

    def checked(self) -> None:
        """The flags are checked: from here the box's end stops start-up at once."""
        self.ready = True
        self.checked_at = time.monotonic()
        if self.expired:
            raise _StartUpTookTheBox()

    def disarm(self) -> None:
        import signal
        if self.armed:
            self.armed = False
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._saved)


def _box_taken_by_start_up(args, watch: _StartUpWatch) -> int:
    from .workers import stop_server
    stop_server()
    secs = round(time.monotonic() - _started(), 2)
    checked = None if watch.checked_at is None else round(watch.checked_at - _started(), 2)
    line = (f"fuzz: start-up took the whole time box ({args.time:g} s): no example ran, "
            f"nothing was found")
    if args.json:
        print(json.dumps({"seed": args.seed, "target": args.target, "examples": 0, "steps": 0,
                          "seconds": secs, "start_up_seconds": secs,
                          "flags_checked_seconds": checked, "findings": [],
                          "stopped": "start-up took the time box"}, indent=1))
    print(line, file=sys.stderr)
    sys.stdout.flush()
    return 0


def run(args) -> int:
    watch = _StartUpWatch(args)
    try:
        return _run(args, watch)
    except _StartUpTookTheBox:
        return _box_taken_by_start_up(args, watch)
    finally:
        watch.disarm()


def _run(args, watch: _StartUpWatch) -> int:
    engine_logs = _route_engine_logs(args)   # before any worker process starts
    from ..resources import cpus
    if min(args.jobs or 1, cpus()) > 1 and args.ray is None:
        from .jobs import start_server
        start_server()         # the workers' imports, while this process checks the flags
    opts = _options(args)      # usage errors first, before the engine is imported
    jobs = _jobs(args)
    watch.checked()
    from .campaign import stderr_progress
    from .workers import run_jobs
    from .stopping import Stop
    opts.progress = None if args.json else stderr_progress
    opts.on_begin = watch.disarm
    with Stop() as stop:
        opts.stop = stop
        if args.ray is not None:
            from .ray_jobs import run_ray
            summary = run_ray(opts, args.ray, args.jobs)
        else:
            summary = run_jobs(opts, jobs)
        if engine_logs:
            summary["engine_logs"] = engine_logs
        if args.json:
            print(json.dumps(summary, indent=1))
        else:
            _print_summary(summary)
        sys.stdout.flush()
    if summary["findings"] or summary.get("lost"):
        return 1
    return 128 + stop.signum if stop.reason else 0


def _route_engine_logs(args):
    """A real engine's own log lines go to ``--out``/engine-logs/ (``targets.logs``),
    not to the terminal the campaign's progress and findings are on; the folder, or
    None for an engine that logs nothing of its own."""
    import os

    from .. import targets
    from ..targets import logs
    cls = targets.TARGETS.get(args.target)
    if cls is None or not getattr(targets.get(args.target), "engine_logs", False):
        return None
    return os.path.dirname(logs.route_to(args.out, args.target))


def _check_shared_db(url: str) -> None:
    """An unreachable shared database is a usage error (one line), before any work."""
    from ..errors import UsageError
    from .db import SharedDatabaseError, connect_redis
    try:
        connect_redis(url).close()
    except SharedDatabaseError as e:
        raise UsageError(f"--db: {e}") from None


def _print_summary(s: dict) -> None:
    what = s["device"] if s["target"] == "reference" else f"{s['target']} {s['engine_version']}"
    cpu = s.get("cpu_seconds")
    per_cpu = f", {s['steps'] / cpu:.0f} per CPU second" if cpu else ""
    print(f"fuzz ({what}, seed {s['seed']}, {s['jobs']} job(s)): {s['examples']} examples, "
          f"{s['steps']} engine steps in {s['seconds']:.1f} s ({s['steps_per_second']:.0f} "
          f"steps/s{per_cpu}), {len(s['findings'])} finding(s)")
    if s.get("engine_logs"):
        print(f"  the engine's own log lines: {s['engine_logs']}/")
    for f in s["findings"]:
        where = f" -> {f['repro']}" if f.get("repro") else ""
        print(f"  {f['id']}: {f['text'].splitlines()[0]}{where}")
        print(f"    found after {f['examples_before']} examples ({f['seconds_before']:.1f} s); "
              f"minimized to {f['repro_requests']} request(s), {f['repro_steps']} steps"
              + (" (shrinking cut short by the time box)" if f.get("shrink_cut") else ""))
    for sl in s.get("ray", {}).get("slices", ()):
        if sl["attempts"] > 1:
            print(f"  rerun: slice {sl['slice']} (its worker was lost; ran on "
                  f"{', '.join(sl['hosts'])})")
    for lost in s.get("lost", ()):
        print(f"  lost: slice {lost['slice']} ({lost['why']})")
    if s.get("killed"):
        print(f"  job(s) {', '.join(map(str, s['killed']))} still running at the end of the "
              f"time box: ended, their findings kept")
    if s.get("stopped"):
        print(f"stopped early ({s['stopped']}); every finding so far is listed and written")
    if s["findings"] and s["findings"][0].get("repro"):
        print(f"replay one with: overlapcheck replay {s['findings'][0]['repro']}")
    sys.stdout.flush()
