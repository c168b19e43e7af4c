"""The observer that feeds checkers: every event to every checker, violations
collected in order and deduplicated into findings by (checker, site).

A checker that raises on an event (values read too early can be anything) is a
finding of its own, naming the checker; the run goes on without it. A ``fatal``
checker's violation (liveness: a zombie) raises ``Halt``, so the run stops there
instead of at the engine's step bound.
"""
from __future__ import annotations

from functools import partial
from typing import Dict, List, Sequence

from invariants.base import Checker, Violation
from overlapcheck.protocol import events as E

from ..protocol.finding import Finding


class Halt(Exception):
    """A fatal checker reported: the run stops (``violation`` says why)."""

    def __init__(self, violation: Violation):
        super().__init__(str(violation))
        self.violation = violation


# (checker classes and idle flags, in order) -> event class -> [(checker index, the name
# of its handler)]: which checkers an event goes to depends on those alone, and every run
# of a campaign builds the same checkers, so the scan is done once per set
_PLANS: Dict[tuple, Dict[type, list]] = {}


EXPAND = "feed each"     # a plan entry: feed the events a VerifiedBatch stands for


def _event_then_checker(item) -> tuple:
    return item[:2]


class Monitor:
    """``Monitor(checkers, log=None)`` is the engine's observer. ``violations``: every
    violation in order; ``findings()``: one per (checker, site), the first seen.

    It takes a batch's decode results as one ``VerifiedBatch`` (``batched``): each
    checker gets the run at once, and the run's violations are listed by the position
    of their event, then by checker, as the per-request events give them (docs/design.md
    §5.4). The log gets the per-request events."""

    batched = True

    def __init__(self, checkers: Sequence[Checker], log=None):
        self.checkers = list(checkers)
        self.log = log
        self.violations: List[Violation] = []
        self.problems: List[Finding] = []     # findings that are no checker's violation
        self._found: Dict[tuple, Finding] = {}
        # event class -> [(checker, its handler)], in checker order: an event goes only to
        # the checkers that handle it (a checker with its own ``feed`` gets every event),
        # none to an idle one
        self._routes: Dict[type, list] = {}
        self._plans = None

    def _route(self, cls: type) -> list:
        plans = self._plans
        if plans is None:
            key = tuple((type(c), bool(getattr(c, "idle", False))) for c in self.checkers)
            plans = self._plans = _PLANS.setdefault(key, {})
        plan = plans.get(cls)
        if plan is None:
            plan = plans[cls] = self._plan(cls)
        checkers = self.checkers
        # EXPAND: the base class's expansion, which calls the checker's own ``feed``
        route = self._routes[cls] = [(checkers[i], partial(Checker.on_VerifiedBatch, checkers[i])
                                      if name == EXPAND else getattr(checkers[i], name))
                                     for i, name in plan]
        return route

    def _plan(self, cls: type) -> list:
        plan = []
        for i, c in enumerate(self.checkers):
            if getattr(c, "idle", False):
                continue
            if type(c).feed is Checker.feed:
                name = "on_" + cls.__name__
                if cls is E.VerifiedBatch and type(c).on_VerifiedBatch is \
                        Checker.on_VerifiedBatch and not (
                            getattr(c, "on_Verified", None) or getattr(c, "on_Canary", None)):
                    continue    # the default expansion would reach no handler
                if getattr(c, name, None):
                    plan.append((i, name))
            else:       # its own ``feed`` sees the per-request events only
                plan.append((i, EXPAND if cls is E.VerifiedBatch else "feed"))
        return plan

    def __call__(self, ev) -> None:
        cls = type(ev)
        if self.log is not None:
            if cls is E.VerifiedBatch:
                for e in ev.events():
                    self.log.event(e)
            else:
                self.log.event(ev)
        route = self._routes.get(cls)
        if route is None:
            route = self._route(cls)
        if cls is E.VerifiedBatch:
            self._run(ev, route)
            return
        for c, handle in route:
            try:
                found = handle(ev)
            except Exception as e:  # noqa: BLE001 - a checker bug, reported as such
                self._crashed(c, ev, e)
                continue
            if found:
                for v in found:
                    self._violation(v)
                if c.fatal and not isinstance(ev, E.Stalled):
                    raise Halt(found[0])

    def _run(self, ev: E.VerifiedBatch, route: list) -> None:
        """Each checker takes the whole run; their violations are then listed as the
        per-request events would have given them: by event, then by checker (which
        finding comes first decides what a campaign shrinks)."""
        found = []
        for k, (c, handle) in enumerate(route):
            try:
                got = handle(ev)
            except Exception as e:  # noqa: BLE001 - as in __call__
                self._crashed(c, ev, e)
                continue
            if got:
                found += [(p, k, v, c) for p, v in got]
        if not found:
            return
        found.sort(key=_event_then_checker)
        for _, _, v, _ in found:
            self._violation(v)
        fatal = next((v for _, _, v, c in found if c.fatal), None)
        if fatal is not None:
            raise Halt(fatal)

    def _violation(self, v: Violation) -> None:
        self.violations.append(v)
        if self.log is not None:
            self.log.violation(v)
        self.add(Finding(v.checker, tuple(map(str, v.site)), v.step, str(v), v.to_json()))

    def _crashed(self, checker: Checker, ev, exc: Exception) -> None:
        self.checkers.remove(checker)
        self._routes.clear()
        self._plans = None
        kind = type(ev).__name__
        self.problem(Finding(checker.name, ("checker-crashed", kind, type(exc).__name__),
                         ev.iteration, f"[{checker.name}] step {ev.iteration}: the checker "
                         f"crashed on event {kind}: {type(exc).__name__}: {exc}"))

    def add(self, f: Finding) -> None:
        self._found.setdefault(f.key, f)

    def problem(self, f: Finding) -> None:
        """A finding that is no checker's violation: an engine exception, a checker
        that crashed, a run that got stuck with liveness off."""
        self.problems.append(f)
        self.add(f)

    def stuck(self, step: int, message: str) -> None:
        """The engine stopped on its own bound or a wait that can never complete. The
        liveness checker reports it from the engine's ``Stalled`` event; this is the
        fallback when liveness is off."""
        if not any(f.checker == "liveness" for f in self._found.values()):
            self.problem(Finding("liveness", ("engine-stuck",), step,
                             f"[liveness] step {step}: {message}"))

    def findings(self) -> List[Finding]:
        return list(self._found.values())

    def finish(self) -> List[Violation]:
        """End of the run: what only the end shows; returns every violation."""
        for c in tuple(self.checkers):
            try:
                found = c.finish()
            except Exception as e:  # noqa: BLE001
                self._crashed(c, E.RunEnd(-1, -1, None), e)
                continue
            for v in found:
                self._violation(v)
        return self.violations
