"""A Hypothesis ``RuleBasedStateMachine`` that drives the engine step by step.

Rules add requests, abort live ones, and run one engine step with a chosen stream
stalled for that step (the schedule is part of the rules, so shrinking minimizes
actions and schedule together). The checkers are fed every event; an ``@invariant``
fails on the first violation. At teardown the engine drains, the end-of-run checks
(leaks at idle) run, and parity replays the run's events against the reference run
of the workload the rules built (known only then).

Use ``machine_for(config)`` to get a test class for your configuration::

    TestMyConfig = machine_for(EngineConfig(page_size=4, pool_tokens=96)).TestCase
"""
from __future__ import annotations

import hashlib
from typing import List, Optional

from hypothesis import strategies as st
from hypothesis.stateful import (Bundle, RuleBasedStateMachine, initialize, invariant,
                                 precondition, rule)

from invariants import make_checkers, names_for

from ..device import make_runtime
from ..device.sched import Stalls
from ..engine import EngineConfig, make_engine
from ..protocol import AbortAt, RequestSpec, Workload
from ..run import Case, Monitor, ScheduleSpec, reference_run
from .strategies import STREAMS, VOCAB


class _StepStalls(Stalls):
    """Eager with one stream stalled during the current engine step."""

    def set(self, stream: Optional[str]) -> None:
        self.stalled = frozenset((stream,)) if stream else frozenset()

    def new_point(self):
        pass


class EngineMachine(RuleBasedStateMachine):
    config = EngineConfig(pool_tokens=160, row_width=48, max_running=4, chunk_size=8)
    max_requests = 8

    rids = Bundle("rids")

    def __init__(self):
        super().__init__()
        from fake_models import make_model
        self.strategy = _StepStalls()
        self.rt = make_runtime("sim", strategy=self.strategy, access="declared")
        self.requests: List[RequestSpec] = []
        self.aborts: List[AbortAt] = []
        # every checker but parity, whose reference needs the whole workload
        self.monitor = Monitor(make_checkers(n for n in names_for("reference") if n != "parity"))
        self.events: list = []
        self.engine = make_engine(self.config, self.rt, make_model(self.config.model),
                                  self._observe)

    def _observe(self, ev) -> None:
        self.events.append(ev)
        self.monitor(ev)

    def _case(self) -> Case:
        return Case(self.config, Workload(tuple(self.requests), tuple(self.aborts)),
                    ScheduleSpec("stalls"))

    @initialize()
    def start(self):
        pass

    @precondition(lambda self: len(self.requests) < self.max_requests)
    @rule(target=rids,
          prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=12),
          max_new=st.integers(1, 16),
          stop=st.lists(st.integers(0, VOCAB - 1), max_size=2))
    def arrive(self, prompt, max_new, stop):
        rid = len(self.requests)
        spec = RequestSpec(rid, self.engine.iteration, tuple(prompt), max_new, tuple(stop), 0)
        self.requests.append(spec)
        self.engine.add(spec)
        return rid

    @rule(rid=rids)
    def abort(self, rid):
        self.aborts.append(AbortAt(rid, self.engine.iteration))
        self.engine.abort(rid)

    @rule(stall=st.sampled_from((None,) + STREAMS))
    def step(self, stall):
        self.strategy.set(stall)
        self.engine.step()
        self.strategy.set(None)

    @invariant()
    def no_violations(self):
        found = self.monitor.findings()
        assert not found, "\n".join(f.text for f in found)

    def teardown(self):
        bound = 2000
        while not self.engine.idle and bound:
            self.engine.step()
            bound -= 1
        if bound == 0:
            self.monitor.stuck(self.engine.iteration, "the engine did not drain at teardown")
        self.monitor.finish()
        if self.requests:
            parity = Monitor(make_checkers(["parity"], reference=reference_run(self._case())))
            for ev in self.events:
                parity(ev)
            parity.finish()
            self.monitor.violations += parity.violations
            for f in parity.findings():
                self.monitor.add(f)
        found = self.monitor.findings()
        assert not found, "\n".join(f.text for f in found)


def machine_for(config: EngineConfig, max_requests: int = 8) -> type:
    """A state machine class for ``config`` (use its ``.TestCase`` in pytest)."""
    tag = hashlib.sha256(repr(config).encode()).hexdigest()[:8]
    return type(f"EngineMachine_{tag}", (EngineMachine,),
                {"config": config, "max_requests": max_requests})
