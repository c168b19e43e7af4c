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

With an example database (``db``: a folder; ``shared_db``: a Redis address shared by a
fleet, ``fuzz/db.py``), the campaign's first Hypothesis run replays the failing
examples saved under its key before it generates any; later runs do not replay (their
known findings no longer fail, and Hypothesis would delete them as fixed). The key is
the campaign's strategy (target, device, models, draft kinds, checkers, faults), so
campaigns of other strategies sharing a database leave each other's examples alone.
"""
from __future__ import annotations

import hashlib
import importlib
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Optional, Sequence

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hseed

try:   # where Hypothesis keeps the literals it mixes into draws (``fixed_constants``)
    from hypothesis.internal.conjecture import providers as _providers
    from hypothesis.internal.constants_ast import Constants as _Constants
except ImportError:     # another Hypothesis layout: nothing to pin
    _providers = _Constants = None
try:   # the runner's step that follows a generated example with copies of it (``no_mutations``)
    from hypothesis.internal.conjecture.engine import ConjectureRunner as _Runner
except ImportError:     # another Hypothesis layout: nothing to turn off
    _Runner = None

from .. import seeds, targets
from ..protocol.finding import Finding
from ..protocol.finding import is_known
from ..run import References, execute
from ..run.driver import release
from .db import open_database


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
    shared_db: Optional[str] = None   # redis://HOST:PORT[/N], multiplexed with ``db``
    # where the time box starts (a ``time.monotonic()`` of this machine; None: when the
    # campaign is built): the command's start, so start-up counts against ``seconds``
    started: Optional[float] = None
    # (checker, site) keys of findings already known (``--known`` repros): they neither
    # fail an example nor are reported, so a campaign looks for other bugs
    known: frozenset = frozenset()
    on_finding: Optional[Callable[["Found"], None]] = None   # each finding, once recorded
    graphs: bool = False   # a GPU device: model calls replay from CUDA graphs (§4.9)


@dataclass
class Stats:
    examples: int = 0      # generated examples
    shrink_runs: int = 0   # engine runs spent shrinking findings
    steps: int = 0
    runs: int = 0
    started: float = field(default_factory=time.monotonic)
    cpu_started: float = field(default_factory=time.process_time)

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.started

    def spent(self, since: Optional[float]) -> float:
        """Seconds since ``since`` (the time box's start), or since the campaign began."""
        return time.monotonic() - (self.started if since is None else since)

    @property
    def cpu_seconds(self) -> float:
        """CPU time of this process since the campaign began (a fair rate on a machine
        shared with other work)."""
        return time.process_time() - self.cpu_started


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


class fixed_constants:
    """``with fixed_constants():`` Hypothesis draws cases without the literals of the
    local modules loaded at the time. Hypothesis mixes into a small share of its draws
    constants read from every non-installed module in ``sys.modules``; a campaign's
    cases would then depend on what else the process imported (a test suite's helpers,
    an editable install against a wheel) and on every literal edited anywhere, not on
    its seed alone. Its own fixed constants stay. Restored on exit (the process's other
    Hypothesis tests keep theirs)."""

    def __enter__(self):
        self._saved = getattr(_providers, "_get_local_constants", None)
        if self._saved is not None:
            empty = _Constants()
            _providers._get_local_constants = lambda: empty
            self._clear()
        return self

    def __exit__(self, *exc):
        if self._saved is not None:
            _providers._get_local_constants = self._saved
            self._clear()
        return False

    @staticmethod
    def _clear():
        # the per-constraints cache holds the constants each kind of draw may take
        cache = getattr(getattr(_providers, "CONSTANTS_CACHE", None), "cache", None)
        if cache is not None:
            cache.clear()


class no_mutations:
    """``with no_mutations():`` Hypothesis generates each example afresh, without the
    copies it runs after a generated one (``generate_mutations_from``: up to six runs of
    the example with one labelled part copied over another of the same label, a
    duplicate value where a parser's test wants one). A case draws its features, config
    and schedule first, so a copy keeps them and differs in a request or a stall. About
    half of a campaign's examples were such copies: a bug behind one feature (two ranks)
    waited for a fresh draw of it, and a long example ran again in copies before the
    next fresh one (docs/design.md §6.5). Shrinking and the database are unchanged.
    Restored on exit."""

    def __enter__(self):
        self._saved = getattr(_Runner, "generate_mutations_from", None)
        if self._saved is not None:
            _Runner.generate_mutations_from = _no_copies
        return self

    def __exit__(self, *exc):
        if self._saved is not None:
            _Runner.generate_mutations_from = self._saved
        return False


def _no_copies(runner, data) -> None:
    """The runner's mutation step, doing nothing."""


def case_strategy(opts: "Options"):
    """The campaign target's Hypothesis strategy of cases."""
    from ..device import device_info
    target = targets.get(opts.target)
    module, fn = target.case_strategy.split(":")
    narrow = {k: v for k, v in (("models", opts.models), ("draft_kinds", opts.draft_kinds))
              if v is not None}
    if "logical_ranks" in target.case_options and not device_info(opts.device).host_flags:
        narrow["logical_ranks"] = False     # a GPU runs one rank per process (run --dist)
    return getattr(importlib.import_module(module), fn)(tuple(opts.checks), tuple(opts.faults),
                                                       **narrow)


class Campaign:
    def __init__(self, opts: Options):
        self.opts = opts
        self.stats = Stats()
        self.found: Dict[tuple, Found] = {}
        self._exc: Dict[tuple, type] = {}
        self._last_progress = time.monotonic()
        self.db = open_database(opts.db, opts.shared_db, say=self._say)
        self.db_key = database_key(opts)
        self.replayed = 0      # saved examples the first run replayed
        self.strategy = case_strategy(opts)
        self.engine_version = targets.get(opts.target).version()
        self.device_options = {"device": opts.device}
        if opts.graphs:
            self.device_options["graphs"] = True
        self.references = References()    # parity's reference runs, computed once each

    # -- budget and progress -------------------------------------------------------------
    def _spent(self) -> bool:
        o = self.opts
        if o.examples is not None and self.stats.examples >= o.examples:
            return True
        # at least one example, even where start-up took the whole box
        return (o.seconds is not None and self.stats.examples > 0
                and self.stats.spent(o.started) >= o.seconds)

    def _shrink_over(self, first_failed: float) -> bool:
        """Is this run's shrinking out of time?"""
        o = self.opts
        if o.seconds is not None:
            return self.stats.spent(o.started) >= o.seconds + (o.shrink_seconds or 0.0)
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

    def _say(self, line: str) -> None:
        if self.opts.progress is not None:
            self.opts.progress(line)

    def _exception_for(self, key: tuple) -> type:
        # A distinct exception type per site: Hypothesis shrinks each bug on its own.
        exc = self._exc.get(key)
        if exc is None:
            exc = self._exc[key] = type(f"Finding{len(self._exc)}", (AssertionError,), {})
        return exc

    # -- one Hypothesis run ----------------------------------------------------------------
    def _run_once(self, run_seed: int, replay: bool = True) -> None:
        o = self.opts
        last: Dict[tuple, tuple] = {}
        failing: list = []
        cut: list = []
        phases = (Phase.explicit,) + ((Phase.reuse,) if replay else ()) + (Phase.generate,
                                                                           Phase.shrink)

        @settings(max_examples=o.batch, deadline=None, database=self.db, derandomize=False,
                  suppress_health_check=list(HealthCheck), report_multiple_bugs=True,
                  phases=phases, print_blob=False)
        @hseed(run_seed)
        @given(self.strategy)
        def prop(case):
            if not failing and self._spent():
                raise _TimeUp()
            if failing and self._shrink_over(failing[0]):
                cut.append(True)    # the smallest failing case so far is kept
                raise _TimeUp()
            out = execute(case, references=self.references, **self.device_options)
            if failing:  # a shrink step of this run's finding
                self.stats.shrink_runs += 1
            else:
                self.stats.examples += 1
            self.stats.steps += out.steps
            self._progress()
            fresh = [f for f in out.findings
                     if f.key not in self.found and not is_known(f.key, self.opts.known)]
            if not fresh:
                release(out)     # only a finding's outcome is kept (its data, for the repro)
            if fresh:
                failing.append(time.monotonic())
                for f in fresh:  # keep when it first failed; the case is the latest (shrunk)
                    first = last.get(f.key, (0, 0, 0, self.stats.examples, self.stats.seconds,
                                             self.stats.steps))
                    last[f.key] = (case, out, f) + first[3:]
                raise self._exception_for(fresh[0].key)(fresh[0].text)

        prop._hypothesis_internal_database_key = self.db_key
        try:
            with fixed_constants(), no_mutations():
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
            path = write_repro(self.opts.out, case, out, f, self.opts.device, self.engine_version,
                               note="shrinking cut short by the time box" if cut else "")
        self.found[f.key] = Found(f, path, n, secs, out.steps, len(case.workload.requests), steps,
                                  cut)
        if self.opts.progress is not None:
            self.opts.progress(f"finding {f.ident} after {n} examples ({secs:.1f}s): "
                               f"{f.text.splitlines()[0]}" + (f" -> {path}" if path else ""))
        if self.opts.on_finding is not None:
            self.opts.on_finding(self.found[f.key])

    def _count_saved(self) -> None:
        if self.db is not None:
            self.replayed = sum(1 for _ in self.db.fetch(self.db_key))
            if self.replayed:
                self._say(f"database: {self.replayed} saved example(s) of this campaign's "
                          f"strategy, replayed before generating")

    def run(self) -> "Campaign":
        i = 0
        self._count_saved()
        while not self._spent():
            self._run_once(seeds.derive(self.opts.seed, "campaign", i) % (2 ** 32), replay=i == 0)
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
                "cpu_seconds": round(s.cpu_seconds, 2),
                "hypothesis_runs": s.runs, "shrink_runs": s.shrink_runs,
                "replayed": self.replayed,
                "findings": [finding_summary(x) for x in self.found.values()]}


def finding_summary(x: Found) -> dict:
    """A finding as the campaign's summary lists it."""
    return {"id": x.finding.ident, "checker": x.finding.checker,
            "site": list(x.finding.site), "step": x.finding.step,
            "repro": x.repro, "examples_before": x.examples_before,
            "seconds_before": round(x.seconds_before, 2),
            "steps_before": x.steps_before,
            "repro_steps": x.steps, "repro_requests": x.requests,
            "shrink_cut": x.shrink_cut, "text": x.finding.text}


def write_repro(folder: str, case, out, f: Finding, device: str, engine_version: str,
                note: str = "") -> str:
    """Write the repro of finding ``f`` of the run ``out`` of ``case`` and its trace under
    ``folder`` (``<checker>-<hash of site>.yaml``, ``.trace.json``); the repro's path."""
    from ..device import device_info
    from ..repro.format import Repro, current_commit, save
    from ..repro.trace import write_trace
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{f.ident}.yaml")
    replayable = device_info(device).replayable
    save(Repro(case, out.choices if replayable else None, f, out.digest, device, out.steps,
               current_commit(), engine_version=engine_version, note=note), path)
    write_trace(out, os.path.join(folder, f"{f.ident}.trace.json"))
    return path


def database_key(opts: Options) -> bytes:
    """The example-database key of a campaign's strategy: campaigns that draw the same
    cases share their saved examples, others do not see them."""
    parts = tuple(None if v is None else tuple(sorted(v)) for v in (
        opts.models, opts.draft_kinds, opts.checks, opts.faults))
    parts = (opts.target, opts.device) + parts
    return hashlib.sha384(repr(("overlapcheck-campaign",) + parts).encode()).digest()


def stderr_progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
