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
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, Optional

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hseed

try:   # where Hypothesis keeps the literals it mixes into draws (``fixed_constants``)
    from hypothesis.internal.conjecture import providers as _providers
    from hypothesis.internal.constants_ast import Constants as _Constants
except ImportError:     # another Hypothesis layout: nothing to pin
    _providers = _Constants = None
try:   # the order in which Hypothesis keeps the smaller of two failing examples
    from hypothesis.control import current_build_context as _build_context
    from hypothesis.internal.conjecture.shrinker import sort_key as _sort_key
except ImportError:     # another Hypothesis layout: the latest failing case is kept
    _build_context = _sort_key = None
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
from .options import Options  # noqa: F401 - the campaign's options live there


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


class _Stopped(BaseException):
    """The campaign was asked to stop (``Options.stop``: a signal, the parent of a
    ``-j`` worker): it stops at once, as at the end of its time box."""


WRITE_EVERY_S = 1.0     # shrinking replaces a repro at most this often


@dataclass
class _Best:
    """The smallest failing case of a finding in the current Hypothesis run."""
    case: object
    out: object
    finding: Finding
    rank: object
    dirty: bool = False      # smaller than what is on disk
    written: float = 0.0     # when its repro was last written


def _note(found: "Found", stopped: Optional[str]) -> str:
    if not found.shrink_cut:
        return ""
    return f"shrinking cut short ({stopped})" if stopped else "shrinking cut short by the time box"


def _simplicity():
    """Hypothesis' order of the example being run (its ``sort_key``: fewer choices, then
    smaller ones), or None where this Hypothesis does not expose it."""
    if _sort_key is None or _build_context is None:
        return None
    try:
        return _sort_key(_build_context().data.nodes)
    except Exception:  # noqa: BLE001 - another layout: every failing case counts as smaller
        return None


def _simpler(a, b) -> bool:
    return a is None or b is None or a < b


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
    if opts.config is not None:
        narrow["config"] = dict(opts.config)
    return getattr(importlib.import_module(module), fn)(tuple(opts.checks), tuple(opts.faults),
                                                       **narrow)


class Campaign:
    def __init__(self, opts: Options):
        self.opts = opts
        self.stats = Stats()
        self.found: Dict[tuple, Found] = {}
        self._closed: set = set()      # keys found by earlier Hypothesis runs: they pass now
        self._best: Dict[tuple, _Best] = {}    # this run's findings: the smallest case so far
        self._exc: Dict[tuple, type] = {}
        self._last_progress = self._last_stats = time.monotonic()
        self.stopped: Optional[str] = None     # why the campaign stopped early (a signal)
        self._unwritable: Optional[str] = None  # why repros can no longer be written
        self._write_cost = 0.05    # seconds a repro takes to write (a running average)
        self._last_update = 0.0    # when a smaller case last replaced a repro
        self.db = open_database(opts.db, opts.shared_db, say=self._say)
        if opts.out:    # part files of a campaign killed mid-write (kill -9) on this host
            from ..repro.format import sweep_stale
            gone = sweep_stale(opts.out)
            if gone:
                self._say(f"{opts.out}: removed {len(gone)} part file(s) a killed "
                          f"campaign left mid-write")
        self.db_key = database_key(opts)
        self.replayed = 0      # saved examples the first run replayed
        self.strategy = case_strategy(opts)
        self.engine_version = targets.get(opts.target).version()
        self.device_options = {"device": opts.device}
        if opts.graphs:
            self.device_options["graphs"] = True
        self.references = References()    # parity's reference runs, computed once each
        # the time box: generation ends at ``box_end``, everything (shrinking included)
        # at ``hard_end``; None without a time budget
        begun = self.stats.started if opts.started is None else opts.started
        self.box_end = None if opts.seconds is None else begun + opts.seconds
        self.hard_end = (None if self.box_end is None
                         else self.box_end + (opts.shrink_seconds or 0.0))

    # -- budget and progress -------------------------------------------------------------
    def _spent(self) -> bool:
        o = self.opts
        if self.stopped is not None:
            return True
        if o.examples is not None and self.stats.examples >= o.examples:
            return True
        return self.box_end is not None and time.monotonic() >= self.box_end

    def _shrink_over(self, first_failed: float) -> bool:
        """Is this run's shrinking out of time?"""
        o = self.opts
        if self.hard_end is not None:
            return time.monotonic() >= self.hard_end - self._reserve()
        return o.shrink_seconds is not None and time.monotonic() - first_failed > o.shrink_seconds

    def _check_stop(self) -> None:
        """Raise ``_Stopped`` when the campaign was asked to stop (``Options.stop``)."""
        if self.stopped is None and self.opts.stop is not None:
            self.stopped = self.opts.stop()
        if self.stopped is not None:
            raise _Stopped()

    def _tick(self, step: int) -> None:
        """At each step of a run: the time box's end, or a stop, cuts the run short (the
        example in flight is dropped; everything found so far is on disk already)."""
        if self.hard_end is not None and time.monotonic() >= self.hard_end - self._reserve():
            raise _TimeUp()
        if self.opts.stop is not None:
            self._check_stop()

    def _progress(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.opts.on_stats is not None and (force or now - self._last_stats >= 1.0):
            self._last_stats = now
            self.opts.on_stats(self.stats)
        if self.opts.progress is None:
            return
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
        failing: list = []
        phases = (Phase.explicit,) + ((Phase.reuse,) if replay else ()) + (Phase.generate,
                                                                           Phase.shrink)
        cut = False

        @settings(max_examples=o.batch, deadline=None, database=self.db, derandomize=False,
                  suppress_health_check=list(HealthCheck), report_multiple_bugs=True,
                  phases=phases, print_blob=False)
        @hseed(run_seed)
        @given(self.strategy)
        def prop(case):
            nonlocal cut
            self._check_stop()
            if not failing and self._spent():
                raise _TimeUp()
            if failing and self._shrink_over(failing[0]):
                cut = True    # the smallest failing case so far is kept
                raise _TimeUp()
            out = execute(case, references=self.references, tick=self._tick,
                          **self.device_options)
            if failing:  # a shrink step of this run's finding
                self.stats.shrink_runs += 1
            else:
                self.stats.examples += 1
            self.stats.steps += out.steps
            self._progress()
            fresh = [f for f in out.findings
                     if f.key not in self._closed and not is_known(f.key, self.opts.known)]
            if not fresh:
                release(out)     # only a finding's outcome is kept (its data, for the repro)
                return
            if not failing:
                failing.append(time.monotonic())
            rank = _simplicity()
            for f in fresh:
                self._keep(case, out, f, rank)
            raise self._exception_for(fresh[0].key)(fresh[0].text)

        prop._hypothesis_internal_database_key = self.db_key
        try:
            with fixed_constants(), no_mutations():
                prop()
        except (_TimeUp, _Stopped):
            cut = cut or bool(failing)
        except BaseException as e:  # noqa: BLE001 - Hypothesis' report of our findings
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
        finally:    # the smallest case of each finding replaces its repro; shrinking is over
            for key in self._best:
                self._flush(key, cut)
            self._closed.update(self._best)
            self._best = {}

    # -- findings, on disk as they are found ------------------------------------------------
    def _keep(self, case, out, f: Finding, rank) -> None:
        """A failing call for ``f``: its first one is written at once (a raw repro); a
        smaller case of it (Hypothesis' order, ``_simplicity``) replaces the repro, at
        most once a second while shrinking, the smallest when the run ends (``_flush``)."""
        best = self._best.get(f.key)
        if best is None:     # first seen (keys of earlier runs no longer fail)
            self._best[f.key] = _Best(case, out, f, rank)
            s = self.stats
            self.found[f.key] = Found(f, None, s.examples, s.seconds, out.steps,
                                      len(case.workload.requests), s.steps)
            self._write(f.key, first=True)
            return
        if not _simpler(rank, best.rank):
            release(out)
            return
        release(best.out)
        best.case, best.out, best.finding, best.rank, best.dirty = case, out, f, rank, True
        now = time.monotonic()
        if now - self._last_update >= WRITE_EVERY_S:
            # one repro replaced a second at most, the one on disk longest (a run that
            # shrinks one bug often shows others: each write costs shrinking time)
            self._last_update = now
            self._write(min((k for k, b in self._best.items() if b.dirty),
                            key=lambda k: self._best[k].written))

    def _flush(self, key: tuple, cut: bool) -> None:
        """The end of the run that shrank ``key``: its smallest case on disk (a repro
        written already is not written again only to change its note)."""
        best, found = self._best[key], self.found[key]
        found.shrink_cut = found.shrink_cut or cut
        if best.dirty:
            self._write(key)
        elif self.opts.on_finding is not None:
            self.opts.on_finding(found)
        release(best.out)

    def _reserve(self) -> float:
        """Seconds to keep at the end of the time box for writing the findings whose
        smaller cases are not on disk yet (``_flush``)."""
        if not self._best:
            return 0.0
        return self._write_cost * sum(1 for b in self._best.values() if b.dirty)

    def _write(self, key: tuple, first: bool = False) -> None:
        """Write (or replace) the repro of ``key`` from its best case; on its first write,
        say so (progress); pass it on (``on_finding``) each time."""
        t0 = time.monotonic()
        best, found = self._best[key], self.found[key]
        best.dirty, best.written = False, t0
        found.finding, found.steps = best.finding, best.out.steps
        found.requests = len(best.case.workload.requests)
        if self.opts.out and not self._unwritable:
            try:
                found.repro = write_repro(self.opts.out, best.case, best.out, best.finding,
                                          self.opts.device, self.engine_version,
                                          note=_note(found, self.stopped), path=found.repro)
                self._write_cost = 0.7 * self._write_cost + 0.3 * (time.monotonic() - t0)
            except OSError as e:      # the folder went away, the disk is full: said once
                self._unwritable = f"{self.opts.out}: {e.strerror or type(e).__name__}"
                self._say(f"cannot write repros to {self._unwritable}; findings are "
                          f"still listed in the summary")
        if first and self.opts.progress is not None:
            f = found.finding
            self.opts.progress(f"finding {f.ident} after {found.examples_before} examples "
                               f"({found.seconds_before:.1f}s): {f.text.splitlines()[0]}"
                               + (f" -> {found.repro}" if found.repro else ""))
        if self.opts.on_finding is not None:
            self.opts.on_finding(found)

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
                "replayed": self.replayed, "stopped": self.stopped,
                "start_up_seconds": round(max(s.started - self.opts.started, 0.0), 2)
                if self.opts.started is not None else 0.0,
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
                note: str = "", path: Optional[str] = None) -> str:
    """Write the repro of finding ``f`` of the run ``out`` of ``case`` and its trace under
    ``folder``; the repro's path. Without ``path`` the repro takes a name of its own,
    ``<checker>-<hash of site>.yaml`` or, where another campaign's repro has it,
    ``...-2.yaml`` and on (``repro.format.write_new``); with ``path`` (a name it took
    before) the repro there is replaced. The trace is ``<name>.trace.json`` beside it."""
    from ..device import device_info
    from ..repro.format import Repro, current_commit, dumps, write_atomic, write_new
    from ..repro.trace import write_trace
    replayable = device_info(device).replayable
    text = dumps(Repro(case, out.choices if replayable else None, f, out.digest, device,
                       out.steps, current_commit(), engine_version=engine_version, note=note))
    if path is None:
        path = write_new(folder, f.ident, ".yaml", text)
    else:
        write_atomic(path, text)
    write_trace(out, path[:-len(".yaml")] + ".trace.json")
    return path


def database_key(opts: Options) -> bytes:
    """The example-database key of a campaign's strategy: campaigns that draw the same
    cases share their saved examples, others do not see them."""
    parts = tuple(None if v is None else tuple(sorted(v)) for v in (
        opts.models, opts.draft_kinds, opts.checks, opts.faults))
    parts = (opts.target, opts.device) + parts
    if opts.config is not None:
        parts += (opts.config,)
    return hashlib.sha384(repr(("overlapcheck-campaign",) + parts).encode()).digest()


def stderr_progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
