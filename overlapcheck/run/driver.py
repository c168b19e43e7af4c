"""The one run driver: run a case on its target with the checkers on, and say what
was found.

``execute(case)`` builds the target's session (for the reference engine: runtime,
model and engine), feeds every event to the checkers through one ``Monitor``, and
turns whatever ends the run — the end of the workload, a fatal checker, a wait that
can never complete, the engine's step bound, an exception, a replay that no longer
fits its recorded choices — into an ``Outcome``. Everything a finding needs to be
reproduced is in it: the recorded decisions, the digest, the findings deduplicated
by (checker, site). ``run``, ``fuzz``, ``replay``, ``minimize``, the pytest plugin,
the tensor-parallel ranks and the benches all run cases through here.

Parity's reference (``reference_run``) is the same workload on the target's
reference config (for the reference engine: non-overlap, one rank, no seed variant,
no fault) under the eager schedule with no detector.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence

from invariants.base import Violation, make_checkers

from .. import targets
from ..device import Diverged, Replay, StuckWait
from ..device.sched import Eager
from ..protocol import EngineStuck, RunResult
from ..protocol.target import Session, TargetUnavailable
from ..protocol import events as E
from ..protocol.finding import ENGINE_EXCEPTION, Finding
from .case import Case, ScheduleSpec
from .monitor import Halt, Monitor

COMPLETED, HALTED, STALLED, CRASHED, DIVERGED = (
    "completed", "halted", "stalled", "crashed", "diverged")


@dataclass
class Outcome:
    """What one run gave. ``status``: completed, halted (a fatal checker stopped it),
    stalled (a wait that can never complete, or the step bound), crashed (the engine
    raised), diverged (a replay left its recorded choices; ``diverged`` says how:
    findings are then empty, since the run says nothing either way)."""

    findings: List[Finding]
    violations: List[Violation]
    status: str
    result: Optional[RunResult]
    steps: int
    choices: List[int]
    digest: str
    diverged: Optional[str] = None
    retired: list = field(default_factory=list)
    marks: list = field(default_factory=list)   # (iteration, clock) at each step end
    races: list = field(default_factory=list)
    problems: List[Finding] = field(default_factory=list)   # findings no checker made
    engine: object = None
    rt: object = None
    session: object = None      # the run's session (``release`` disposes of it)


def digest_of(result: Optional[RunResult], retired) -> str:
    h = hashlib.sha256()
    if result is not None:
        h.update(json.dumps(result.to_json(), sort_keys=True).encode())
    # one update of the whole trace: the same bytes, so the same digest, as an update
    # per retired op (a run retires hundreds; per op this was about 1% of a campaign)
    h.update("".join([f"{stream}|{name};" for stream, name, _ in retired]).encode())
    return h.hexdigest()[:16]


def _package_dir(name: Optional[str]) -> Optional[str]:
    """The folder of an imported package (a target's engine), or None."""
    mod = sys.modules.get(name) if name else None
    path = getattr(mod, "__file__", None)
    return os.path.dirname(path) + os.sep if path else None


def _exception_finding(exc: BaseException, step: int, engine: Optional[str] = None) -> Finding:
    """Named by the exception type and the innermost frame of our code or of the
    target's ``engine`` package (for a real engine, where its own code failed): its
    file and function, not its line, so that an edit elsewhere in the file (or a new
    release of the engine) keeps the bug's id; the text gives the line too."""
    frames = []      # (file, line, function) from the outermost frame in
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        frames.append((code.co_filename, tb.tb_lineno, getattr(code, "co_qualname", code.co_name)))
        tb = tb.tb_next
    root = _package_dir(engine)
    ours = [f for f in frames if any(p in f[0] for p in ("overlapcheck", "fake_models", "invariants"))
            or (root is not None and f[0].startswith(root))]
    frames = ours or frames
    where, at = "?", "?"
    if frames:
        name = os.path.basename(frames[-1][0])
        where, at = f"{name}:{frames[-1][2]}", f"{name}:{frames[-1][1]}, in {frames[-1][2]}"
    # an exception that names its own site (a kernel and its twin disagreeing: the
    # kernel, not the line of the check that raised)
    where = getattr(exc, "finding_site", None) or where
    text = f"[{ENGINE_EXCEPTION}] step {step}: {type(exc).__name__}: {exc} (at {at})"
    return Finding(ENGINE_EXCEPTION, (type(exc).__name__, where), step, text)


def checker_names(case: Case) -> List[str]:
    """The checkers a case runs: its ``checks``, or every registered checker that
    reads what its target emits."""
    from invariants.base import names_for
    return list(case.checks) or names_for(case.target)


def reference_run(case: Case, model=None, device: Optional[str] = None,
                  straight: bool = True, tick: Optional[Callable[[int], None]] = None) -> RunResult:
    """The parity reference of ``case``: its workload on the target's reference config,
    eager, no detector, no checker; on the target's default device, or ``device``
    (``Target.reference_device``). On the default device, a target's straight runtime
    (``Target.straight_runtime``) runs it where it has one, unless ``straight`` is off:
    the same ``RunResult`` at less cost (docs/design.md §6.4). ``tick``: as ``execute``'s,
    where the target's session takes one (the reference engine's)."""
    target = targets.get(case.target)
    options = {"model": model} if model is not None else {}
    if device is not None:
        options["device"] = device
    elif straight:
        rt = target.straight_runtime()
        if rt is not None:
            options["runtime"] = rt
    session = target.open(target.reference_config(case.config), Eager(), None,
                          detect=False, trace=False, **options)
    try:
        return session.run(case.workload, tick=tick) if tick is not None else session.run(
            case.workload)
    finally:
        session.close()
        session.dispose()


def release(out: "Outcome") -> None:
    """Drop ``out``'s engine and runtime, disposed (``Session.dispose``): for a caller
    that keeps only the outcome's data (a campaign, for examples that found nothing
    new)."""
    if out.session is not None:
        out.session.dispose()
    out.engine = out.rt = out.session = None


class References:
    """Parity's reference runs kept across the runs of one caller (a campaign): a
    campaign runs one workload again under other schedules, and under configs that share
    its reference config (about one example in six), and the reference run is
    deterministic (eager, no detector), so it is computed once. Keyed by (target,
    reference config, workload), for runs with the target's own model; the newest
    ``keep`` are kept. Checkers only read a ``RunResult``."""

    def __init__(self, keep: int = 256):
        self.keep = keep
        self.runs: "OrderedDict[tuple, RunResult]" = OrderedDict()

    def get(self, case: Case, device: Optional[str] = None, tick=None) -> RunResult:
        try:
            key = (case.target, targets.get(case.target).reference_config(case.config),
                   case.workload, device)
            hit = self.runs.get(key)
        except TypeError:      # a target whose config is not hashable
            return reference_run(case, device=device, tick=tick)
        if hit is None:
            hit = self.runs[key] = reference_run(case, device=device, tick=tick)
            if len(self.runs) > self.keep:
                self.runs.popitem(last=False)
        else:
            self.runs.move_to_end(key)
        return hit


def _context(case: Case, names: Sequence[str], model, reference,
             references: Optional[References] = None, device: Optional[str] = None,
             tick=None) -> dict:
    """What checkers need beyond the events: parity's reference run (none when that
    run fails: the run under test reports the engine's failures), on ``device`` when
    the target names one; ``tick`` hears its steps (``execute``)."""
    if "parity" not in names or not case.workload.requests:
        return {}
    if reference is None:
        try:
            reference = (references.get(case, device, tick)
                         if references is not None and model is None
                         else reference_run(case, model, device, tick=tick))
        except Exception:  # noqa: BLE001
            return {}
    return {"reference": reference}


def execute(case: Case, choices: Optional[List[int]] = None, *, reference=None, log=None,
            max_steps: Optional[int] = None, context: Optional[dict] = None,
            trace: bool = True, references: Optional[References] = None,
            tick: Optional[Callable[[int], None]] = None, **options) -> Outcome:
    """Run ``case``; with ``choices``, replay them exactly. ``reference``: parity's
    reference ``RunResult`` (default: ``reference_run``, or from ``references``, the
    caller's ``References``); ``log``: a ``RunLog``;
    ``context``: more checker context (e.g. ``liveness_bound``); ``tick``: called with
    the step at each step's end, after the checkers, and at each step of parity's
    reference run where it is computed here (a campaign's clock, a command's progress
    line); what it raises that is not an ``Exception`` (a time box running out, a stop)
    ends the run and passes through; ``options`` go to
    the target (reference engine: ``device``, ``model``, ``runtime``, ``access``,
    ``engine`` — an engine factory a test plants a bug through). A replay that leaves
    its choices while the engine is still being built is ``diverged`` like one that
    leaves them later."""
    target = targets.get(case.target)
    names = checker_names(case)
    if case.audit and getattr(target, "audits", False) and not options.get("graphs"):
        # the launches' declarations audited (a CUDA graph's kernels are hidden from
        # interception: graphed runs take declarations only, §4.9)
        options.setdefault("access", "audit")
    if case.twins != "run" and getattr(target, "twins", False):
        options.setdefault("twins", case.twins)
    run_device = (options["runtime"].backend if options.get("runtime") is not None
                  else options.get("device", "sim"))
    ref_device = target.reference_device(case.config, run_device, options.get("model"))
    ctx = (target.checker_context(case.config) if ref_device is None
           else target.checker_context(case.config, ref_device))
    ctx.update(_context(case, names, options.get("model"), reference, references, ref_device,
                        tick))
    ctx.update(context or {})
    monitor = Monitor(make_checkers(names, **ctx), log=log)
    strategy = Replay(choices) if choices is not None else case.schedule.make()
    marks: list = []
    session = None

    def observer(ev) -> None:
        monitor(ev)
        if isinstance(ev, E.StepEnd):
            marks.append((ev.iteration, session.clock))
            if tick is not None:
                tick(ev.iteration)

    observer.batched = monitor.batched      # it passes a VerifiedBatch on as it is
    result, status, diverged = None, COMPLETED, None
    try:
        session = target.open(case.config, strategy, observer, case.faults, trace=trace,
                              **options)
    except Diverged as e:   # building the engine already asked for more than was recorded
        session, status, diverged = _Unopened(), DIVERGED, str(e)
    try:
        if diverged is None:
            try:
                result = session.run(case.workload, max_steps=max_steps)
            finally:
                session.close()
    except Diverged as e:
        status, diverged = DIVERGED, str(e)
    except TargetUnavailable:
        raise      # the process cannot run this engine (a missing or compiled build): no finding
    except Halt:
        status = HALTED    # a fatal checker (liveness) reported: a finding already
    except (EngineStuck, StuckWait) as e:
        status = STALLED
        monitor.stuck(session.iteration, str(e))
    except Exception as e:  # noqa: BLE001 - the engine's own failure is a finding
        status = CRASHED
        monitor.problem(_exception_finding(e, session.iteration, target.package))
    if diverged is None and isinstance(strategy, Replay) and not strategy.exhausted:
        status, diverged = DIVERGED, (f"the run ended after {strategy.pos} of "
                                      f"{len(strategy.choices)} recorded decisions")
    violations = monitor.finish() if diverged is None else []
    if log is not None:
        log.end(status, session.iteration)
    retired = session.retired
    return Outcome(monitor.findings() if diverged is None else [], violations, status, result,
                   session.iteration, session.choices, digest_of(result, retired), diverged,
                   retired, marks, session.races, monitor.problems, session.engine,
                   session.runtime, session)


class _Unopened(Session):
    """The session of a replay that left its recorded choices while its engine was
    being built: nothing ran."""


_RUN_OPTIONS = {"choices", "reference", "references", "log", "max_steps", "context", "trace",
                "tick", "device", "model", "runtime", "access", "detect", "engine", "graphs",
                "twins"}


def run_checked(cfg, workload, checks: Sequence[str] = (), seed: int = 0,
                strategy: str = "random", **kw) -> Outcome:
    """``execute`` of the reference-engine case (``cfg``, ``workload``, the named
    ``strategy`` seeded with ``seed``, ``checks``: empty for all). Keywords that are
    not run options are checker context (``parity_accept``, ``liveness_bound``)."""
    context = {k: kw.pop(k) for k in list(kw) if k not in _RUN_OPTIONS}
    if context:
        kw["context"] = {**kw.get("context", {}), **context}
    return execute(Case(cfg, workload, ScheduleSpec(strategy, seed), tuple(checks)), **kw)


def run_workload(cfg, workload, device: str = "sim", seed: int = 0, strategy: str = "random",
                 detect: bool = True, access: str = "declared", observer=None,
                 model=None) -> RunResult:
    """The reference engine on ``workload`` with no checker: its ``RunResult`` (the
    runtime's race reports are counted in the summary)."""
    from ..device import make_strategy
    from .. import seeds
    options = {"model": model} if model is not None else {}
    session = targets.get("reference").open(
        cfg, make_strategy(strategy, seeds.stream(seed, "schedule")), observer, device=device,
        detect=detect, access=access, **options)
    return session.run(workload)
