"""A fuzz campaign: Hypothesis runs, one after another, until the budget is spent.

Each Hypothesis run generates cases of the campaign's target and runs them with every
checker on. A finding whose (checker, site) is new makes the example fail; Hypothesis
shrinks it, and the last failing call for that site (Hypothesis replays the minimal
example last) is written as a repro with its trace. Known sites no longer fail later
runs, so a night of campaigns reports each bug once. The campaign is deterministic
for a seed, up to where the time budget cuts it.

The time budget is a promise: generation stops at ``seconds`` and shrinking at
``seconds + shrink_seconds`` (default: no more than the budget), after which the
smallest failing case found so far is written; the summary says which findings were
cut short. Without a time budget, ``shrink_seconds`` caps shrinking per finding.
"""
from __future__ import annotations

import importlib
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Optional, Sequence

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hseed
from hypothesis.database import DirectoryBasedExampleDatabase

from .. import seeds, targets
from ..run import Finding, execute


@dataclass
class Options:
    seconds: Optional[float] = 60.0
    examples: Optional[int] = None
    seed: int = 0
    device: str = "sim"
    target: str = "reference"
    models: Optional[Sequence[str]] = None        # reference engine: None is the oracle
    draft_kinds: Optional[Sequence[str]] = None   # reference engine: None, every kind
    checks: Sequence[str] = ()
    faults: Sequence[str] = ()
    out: Optional[str] = None
    db: Optional[str] = None
    batch: int = 25
    # with ``seconds``: shrinking's time past the budget (None: none); without, a cap
    # on shrinking one finding (None: Hypothesis' own)
    shrink_seconds: Optional[float] = None
    progress: Optional[Callable[[str], None]] = None


@dataclass
class Stats:
    examples: int = 0      # generated examples
    shrink_runs: int = 0   # engine runs spent shrinking findings
    steps: int = 0
    runs: int = 0
    started: float = field(default_factory=time.monotonic)

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.started


@dataclass
class Found:
    finding: Finding
    repro: Optional[str]
    examples_before: int
    seconds_before: float
    steps: int
    requests: int
    steps_before: int = 0     # engine steps run before the first failing example
    shrink_cut: bool = False  # the time box ended its shrinking


class _TimeUp(BaseException):
    """The campaign's time box ran out in the middle of a Hypothesis run: it stops at
    once (a ``BaseException``, so Hypothesis does not take it for a failure)."""


def case_strategy(opts: "Options"):
    """The campaign target's Hypothesis strategy of cases."""
    target = targets.get(opts.target)
    module, fn = target.case_strategy.split(":")
    narrow = {k: v for k, v in (("models", opts.models), ("draft_kinds", opts.draft_kinds))
              if v is not None}
    return getattr(importlib.import_module(module), fn)(tuple(opts.checks), tuple(opts.faults),
                                                       **narrow)


class Campaign:
    def __init__(self, opts: Options):
        self.opts = opts
        self.stats = Stats()
        self.found: Dict[tuple, Found] = {}
        self._exc: Dict[tuple, type] = {}
        self._last_progress = time.monotonic()
        self.db = DirectoryBasedExampleDatabase(opts.db) if opts.db else None
        self.strategy = case_strategy(opts)
        self.engine_version = targets.get(opts.target).version()
        self.device_options = {"device": opts.device}

    # -- budget and progress -------------------------------------------------------------
    def _spent(self) -> bool:
        o = self.opts
        if o.examples is not None and self.stats.examples >= o.examples:
            return True
        return o.seconds is not None and self.stats.seconds >= o.seconds

    def _shrink_over(self, first_failed: float) -> bool:
        """Is this run's shrinking out of time?"""
        o = self.opts
        if o.seconds is not None:
            return self.stats.seconds >= o.seconds + (o.shrink_seconds or 0.0)
        return o.shrink_seconds is not None and time.monotonic() - first_failed > o.shrink_seconds

    def _progress(self, force: bool = False) -> None:
        if self.opts.progress is None:
            return
        now = time.monotonic()
        if force or now - self._last_progress >= 5.0:
            self._last_progress = now
            s = self.stats
            rate = s.steps / s.seconds if s.seconds > 0 else 0.0
            self.opts.progress(f"[{s.seconds:6.1f}s] examples {s.examples}, steps {s.steps} "
                               f"({rate:.0f} steps/s), findings {len(self.found)}")

    def _exception_for(self, key: tuple) -> type:
        # A distinct exception type per site: Hypothesis shrinks each bug on its own.
        exc = self._exc.get(key)
        if exc is None:
            exc = self._exc[key] = type(f"Finding{len(self._exc)}", (AssertionError,), {})
        return exc

    # -- one Hypothesis run ----------------------------------------------------------------
    def _run_once(self, run_seed: int) -> None:
        o = self.opts
        last: Dict[tuple, tuple] = {}
        failing: list = []
        cut: list = []

        @settings(max_examples=o.batch, deadline=None, database=self.db, derandomize=False,
                  suppress_health_check=list(HealthCheck), report_multiple_bugs=True,
                  phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink),
                  print_blob=False)
        @hseed(run_seed)
        @given(self.strategy)
        def prop(case):
            if not failing and self._spent():
                raise _TimeUp()
            if failing and self._shrink_over(failing[0]):
                cut.append(True)    # the smallest failing case so far is kept
                raise _TimeUp()
            out = execute(case, **self.device_options)
            if failing:  # a shrink step of this run's finding
                self.stats.shrink_runs += 1
            else:
                self.stats.examples += 1
            self.stats.steps += out.steps
            self._progress()
            fresh = [f for f in out.findings if f.key not in self.found]
            if fresh:
                failing.append(time.monotonic())
                for f in fresh:  # keep when it first failed; the case is the latest (shrunk)
                    first = last.get(f.key, (0, 0, 0, self.stats.examples, self.stats.seconds,
                                             self.stats.steps))
                    last[f.key] = (case, out, f) + first[3:]
                raise self._exception_for(fresh[0].key)(fresh[0].text)

        try:
            prop()
        except _TimeUp:
            pass
        except BaseException as e:  # noqa: BLE001 - Hypothesis' report of our findings
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
        for key, (case, out, f, n, secs, steps) in last.items():
            if key not in self.found:
                self._record(case, out, f, n, secs, steps, bool(cut))

    def _record(self, case, out, f: Finding, n: int, secs: float, steps: int = 0,
                cut: bool = False) -> None:
        path = None
        if self.opts.out:
            from ..repro.format import Repro, current_commit, save
            from ..repro.trace import write_trace
            os.makedirs(self.opts.out, exist_ok=True)
            path = os.path.join(self.opts.out, f"{f.ident}.yaml")
            from ..device import device_info
            replayable = device_info(self.opts.device).replayable
            rep = Repro(case, out.choices if replayable else None, f, out.digest,
                        self.opts.device, out.steps, current_commit(),
                        engine_version=self.engine_version,
                        note="shrinking cut short by the time box" if cut else "")
            save(rep, path)
            write_trace(out, os.path.join(self.opts.out, f"{f.ident}.trace.json"))
        self.found[f.key] = Found(f, path, n, secs, out.steps, len(case.workload.requests), steps,
                                  cut)
        if self.opts.progress is not None:
            self.opts.progress(f"finding {f.ident} after {n} examples ({secs:.1f}s): "
                               f"{f.text.splitlines()[0]}" + (f" -> {path}" if path else ""))

    def run(self) -> "Campaign":
        i = 0
        while not self._spent():
            self._run_once(seeds.derive(self.opts.seed, "campaign", i) % (2 ** 32))
            self.stats.runs += 1
            i += 1
        self._progress(force=True)
        return self

    def summary(self) -> dict:
        s = self.stats
        return {"seed": self.opts.seed, "device": self.opts.device, "target": self.opts.target,
                "engine_version": self.engine_version, "examples": s.examples,
                "steps": s.steps, "seconds": round(s.seconds, 2),
                "steps_per_second": round(s.steps / s.seconds, 1) if s.seconds else 0.0,
                "hypothesis_runs": s.runs, "shrink_runs": s.shrink_runs,
                "findings": [{"id": x.finding.ident, "checker": x.finding.checker,
                              "site": list(x.finding.site), "step": x.finding.step,
                              "repro": x.repro, "examples_before": x.examples_before,
                              "seconds_before": round(x.seconds_before, 2),
                              "steps_before": x.steps_before,
                              "repro_steps": x.steps, "repro_requests": x.requests,
                              "shrink_cut": x.shrink_cut, "text": x.finding.text}
                             for x in self.found.values()]}


def stderr_progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
