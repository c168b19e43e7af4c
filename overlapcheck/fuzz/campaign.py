"""A fuzz campaign: Hypothesis runs, one after another, until the budget is spent.

Each Hypothesis run generates cases and runs them with every checker on. A finding
whose (checker, site) is new makes the example fail; Hypothesis shrinks it, and the
last failing call for that site (Hypothesis replays the minimal example last) is
written as a repro with its trace. Known sites no longer fail later runs, so a night
of campaigns reports each bug once. The campaign is deterministic for a seed, up to
where the time budget cuts it.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Optional, Sequence

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hseed
from hypothesis.database import DirectoryBasedExampleDatabase

from .. import seeds
from ..run import Finding, execute
from .strategies import cases


@dataclass
class Options:
    seconds: Optional[float] = 60.0
    examples: Optional[int] = None
    seed: int = 0
    device: str = "sim"
    models: Sequence[str] = ("oracle",)
    draft_kinds: Optional[Sequence[str]] = None   # None: every kind the engine has
    checks: Sequence[str] = ()
    faults: Sequence[str] = ()
    out: Optional[str] = None
    db: Optional[str] = None
    batch: int = 25
    shrink_seconds: Optional[float] = None   # cap on shrinking one finding (None: Hypothesis')
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


class Campaign:
    def __init__(self, opts: Options):
        self.opts = opts
        self.stats = Stats()
        self.found: Dict[tuple, Found] = {}
        self._exc: Dict[tuple, type] = {}
        self._last_progress = time.monotonic()
        self.db = DirectoryBasedExampleDatabase(opts.db) if opts.db else None

    # -- budget and progress -------------------------------------------------------------
    def _spent(self) -> bool:
        o = self.opts
        if o.examples is not None and self.stats.examples >= o.examples:
            return True
        return o.seconds is not None and self.stats.seconds >= o.seconds

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
        failing = []

        @settings(max_examples=o.batch, deadline=None, database=self.db, derandomize=False,
                  suppress_health_check=list(HealthCheck), report_multiple_bugs=True,
                  phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink),
                  print_blob=False)
        @hseed(run_seed)
        @given(cases(o.checks, o.faults, o.models, o.draft_kinds))
        def prop(case):
            if not failing and self._spent():
                return
            if failing and o.shrink_seconds is not None and \
                    time.monotonic() - failing[0] > o.shrink_seconds:
                return  # shrinking time is up: the smallest failing case so far is kept
            out = execute(case, device=o.device)
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
        except BaseException as e:  # noqa: BLE001 - Hypothesis' report of our findings
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
        for key, (case, out, f, n, secs, steps) in last.items():
            if key not in self.found:
                self._record(case, out, f, n, secs, steps)

    def _record(self, case, out, f: Finding, n: int, secs: float, steps: int = 0) -> None:
        path = None
        if self.opts.out:
            from ..repro.format import Repro, current_commit, save
            from ..repro.trace import write_trace
            os.makedirs(self.opts.out, exist_ok=True)
            path = os.path.join(self.opts.out, f"{f.ident}.yaml")
            from ..device import device_info
            replayable = device_info(self.opts.device).replayable
            rep = Repro(case, out.choices if replayable else None, f, out.digest,
                        self.opts.device, out.steps, current_commit())
            save(rep, path)
            write_trace(out, os.path.join(self.opts.out, f"{f.ident}.trace.json"))
        self.found[f.key] = Found(f, path, n, secs, out.steps, len(case.workload.requests), steps)
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
        return {"seed": self.opts.seed, "device": self.opts.device, "examples": s.examples,
                "steps": s.steps, "seconds": round(s.seconds, 2),
                "steps_per_second": round(s.steps / s.seconds, 1) if s.seconds else 0.0,
                "hypothesis_runs": s.runs, "shrink_runs": s.shrink_runs,
                "findings": [{"id": x.finding.ident, "checker": x.finding.checker,
                              "site": list(x.finding.site), "step": x.finding.step,
                              "repro": x.repro, "examples_before": x.examples_before,
                              "seconds_before": round(x.seconds_before, 2),
                              "steps_before": x.steps_before,
                              "repro_steps": x.steps, "repro_requests": x.requests,
                              "text": x.finding.text}
                             for x in self.found.values()]}


def stderr_progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
