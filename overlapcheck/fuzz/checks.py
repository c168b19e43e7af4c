"""One run's checkers: built from the case, fed the engine's events, finished at
the end, their violations turned into deduplicated findings."""
from __future__ import annotations

from typing import Dict, List, Optional

from invariants.base import Violation, feed_all, make_checkers

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
        self._last_step = ev.iteration
        for v in feed_all(self.checkers, ev):
            self._violation(v)

    def stuck(self, step: int, message: str) -> None:
        from .execute import Finding
        self.add(Finding("liveness", ("engine-stuck",), step, f"[liveness] step {step}: {message}"))

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
