"""Driving checkers over one run: the engine observer (``Monitor``) and a runner.

For one run::

    checkers = make_checkers(names, reference=ref_result)   # names=() : all
    mon = Monitor(checkers, log=RunLog(path, run_info))      # log optional
    eng = Engine(cfg, rt, model, observer=mon)
    try:
        eng.run(workload)
    except Halt:            # a fatal violation (liveness zombie) stopped the run
        ...
    except (StuckWait, EngineStuck):   # already reported as a liveness violation
        ...
    violations = mon.finish()

``run_checked`` does all of that (and the parity reference run when asked).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import List, Optional, Sequence

from overlapcheck.device import StuckWait, make_runtime
from overlapcheck.engine import Engine, EngineConfig, EngineStuck, RunResult, make_engine
from overlapcheck.engine import events as E

from .base import Checker, Violation, make_checkers


class Halt(Exception):
    """A fatal checker reported: the run stops (``violation`` says why)."""

    def __init__(self, violation: Violation):
        super().__init__(str(violation))
        self.violation = violation


class Monitor:
    """The engine's observer: feeds each event to every checker (and to ``log``),
    collects violations; raises ``Halt`` on a fatal checker's violation."""

    def __init__(self, checkers: Sequence[Checker], log=None, stop_on_fatal: bool = True):
        self.checkers = list(checkers)
        self.log = log
        self.stop_on_fatal = stop_on_fatal
        self.violations: List[Violation] = []

    def __call__(self, event) -> None:
        if self.log is not None:
            self.log.event(event)
        for c in self.checkers:
            found = c.feed(event)
            if found:
                self._add(found)
                if c.fatal and self.stop_on_fatal and not isinstance(event, E.Stalled):
                    raise Halt(found[0])

    def _add(self, found: List[Violation]) -> None:
        self.violations.extend(found)
        if self.log is not None:
            for v in found:
                self.log.violation(v)

    def finish(self) -> List[Violation]:
        """End of the run: collect what only the end shows; returns all violations."""
        for c in self.checkers:
            self._add(c.finish())
        return self.violations


@dataclass
class CheckedRun:
    result: Optional[RunResult]
    violations: List[Violation]
    status: str                 # completed, halted (fatal violation) or stalled
    rt: object
    engine: Engine


def reference_run(cfg: EngineConfig, workload, model=None) -> RunResult:
    """The parity reference: the same workload and model on the standard schedule —
    non-overlap, one rank, none of the seed variants (zero-bubble, verify sync, KV
    backup), no fault — on the eager sim with the detector off. A variant or a fault
    that changes tokens or accept lengths, even without overlap, shows as a parity
    finding."""
    from fake_models import make_model
    rt = make_runtime("sim", seed=0, strategy="eager", detect=False)
    model = model if model is not None else make_model(cfg.model)
    std = dataclasses.replace(cfg, overlap=False, tp=1, zero_bubble=False, verify_sync=False,
                              kv_backup=False, faults=())
    return Engine(std, rt, model).run(workload)


def run_checked(cfg: EngineConfig, workload, checks: Sequence[str] = (), seed: int = 0,
                device: str = "sim", strategy="random", access: str = "declared",
                model=None, reference: Optional[RunResult] = None, log=None,
                max_steps: Optional[int] = None, engine_cls=make_engine, rt=None,
                **context) -> CheckedRun:
    """Run ``workload`` with the checkers ``checks`` (empty: all) on. Parity's
    reference is ``reference`` or, when parity is on, a fresh ``reference_run``.
    ``engine_cls`` (default ``make_engine``: TP ranks when ``cfg.tp > 1``) lets a test
    plant a bug through an ``Engine`` subclass."""
    from fake_models import make_model
    model = model if model is not None else make_model(cfg.model)
    if reference is None and (not checks or "parity" in checks):
        reference = reference_run(cfg, workload, model)
    checkers = make_checkers(checks, reference=reference, **context)
    mon = Monitor(checkers, log=log)
    if rt is None:
        rt = make_runtime(device, seed=seed, strategy=strategy, access=access)
    eng = engine_cls(cfg, rt, model, mon)
    result, status = None, "completed"
    try:
        result = eng.run(workload, max_steps=max_steps)
    except Halt:
        status = "halted"
    except (StuckWait, EngineStuck):
        status = "stalled"
    violations = mon.finish()
    if log is not None:
        log.end(status, eng.iteration)
    return CheckedRun(result, violations, status, rt, eng)
