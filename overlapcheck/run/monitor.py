"""One run's checkers: built from the case, fed the engine's events, finished at
the end, their violations turned into deduplicated findings."""
from __future__ import annotations

from typing import Dict, List, Optional

from invariants.base import Violation, make_checkers

from .case import Case


class CheckSession:
    def __init__(self, case: Case, rt):
        self.case = case
        self.rt = rt
        self.checkers = make_checkers(case.checks, **_context(case))
        self._found: Dict[tuple, "object"] = {}
        self._last_step = 0

    def _violation(self, v: Violation) -> None:
        from .execute import Finding
        f = Finding(v.checker, tuple(map(str, v.site)), v.step, str(v), v.to_json())
        self.add(f)

    def add(self, f) -> None:
        self._found.setdefault(f.key, f)

    def feed(self, ev) -> None:
        """Feed one event; raise ``Halted`` when a fatal checker (liveness: a zombie)
        reported, so the run stops there instead of at the engine's step bound."""
        from invariants.drive import Halt
        from overlapcheck.engine import events as E
        self._last_step = ev.iteration
        for c in list(self.checkers):
            try:
                found = c.feed(ev)
            except Exception as e:  # noqa: BLE001 - a checker bug, reported as such
                self._crashed(c, ev, e)
                continue
            for v in found:
                self._violation(v)
            if found and c.fatal and not isinstance(ev, E.Stalled):
                raise Halt(found[0])

    def _crashed(self, checker, ev, exc: Exception) -> None:
        """A checker raised on an event (values read too early can be anything): that
        is a finding of its own, naming the checker; the run goes on without it."""
        from .execute import Finding
        self.checkers.remove(checker)
        kind = type(ev).__name__
        self.add(Finding(checker.name, ("checker-crashed", kind, type(exc).__name__),
                         ev.iteration, f"[{checker.name}] step {ev.iteration}: the checker "
                         f"crashed on event {kind}: {type(exc).__name__}: {exc}"))

    def stuck(self, step: int, message: str) -> None:
        """The engine stopped on its own bound or a wait that can never complete. The
        liveness checker reports it from the engine's ``Stalled`` event; this is the
        fallback when liveness is off."""
        from .execute import Finding
        if not any(f.checker == "liveness" for f in self._found.values()):
            self.add(Finding("liveness", ("engine-stuck",), step,
                             f"[liveness] step {step}: {message}"))

    def current(self) -> List:
        """Findings so far."""
        return list(self._found.values())

    def finish(self, result: Optional[object]) -> List:
        for c in self.checkers:
            for v in c.finish():
                self._violation(v)
        return list(self._found.values())


def _context(case: Case) -> dict:
    """What checkers need beyond the events: parity's reference, the clean engine's
    non-overlap run of the same workload (no reference when that run fails)."""
    if (case.checks and "parity" not in case.checks) or not case.workload.requests:
        return {}       # (a state machine feeds its requests as it goes: no reference)
    import dataclasses

    from invariants.drive import reference_run
    try:
        return {"reference": reference_run(dataclasses.replace(case.config, faults=()),
                                           case.workload)}
    except Exception:  # noqa: BLE001 - the run under test reports the engine's failures
        return {}
