"""Run catalogue cases and judge them.

On ``sim`` every case runs under several schedules (eager, and random, PCT and BUGGIFY
with a few seeds each); the detector is happens-before, so all schedules must give the
same verdict. On ``cuda`` a case runs once, with the detector on. A run *detects* when
the detector reports at least one race or the runtime raises ``AnnotationError`` (a
launch touched rows outside its annotation: an annotation may not hide an access).

A case is ok when it was detected exactly when a race was planted, every reported
kind is one the case expects, all schedules agreed, nothing else went wrong, and (on
cuda, for stream<->stream cases) PyTorch's CUDA sanitizer agreed too.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Tuple

from .cases import ANNOTATION, Case, catalogue

SEEDS_PER_STRATEGY = 3


@dataclass(frozen=True)
class Run:
    """One execution of a case: where, what it found, and the first finding's text."""

    strategy: str
    seed: int
    detected: bool
    kinds: Tuple[str, ...]
    error: Optional[str] = None
    first: Optional[str] = None


@dataclass
class Verdict:
    """The judgement of one case over all its runs (and the sanitizer, on cuda)."""

    case: Case
    runs: List[Run]
    sanitizer: Optional[str] = None  # "flagged", "not flagged", "n/a", "error: ..."
    problems: List[str] = field(default_factory=list)

    @property
    def detected(self) -> bool:
        return any(r.detected for r in self.runs)

    @property
    def kinds(self) -> Tuple[str, ...]:
        return tuple(sorted({k for r in self.runs for k in r.kinds}))

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict:
        c = self.case
        return {"case": c.name, "expect_race": c.expect_race, "expected_kinds": list(c.kinds),
                "detected": self.detected, "kinds": list(self.kinds), "ok": self.ok,
                "problems": list(self.problems), "twin": c.twin,
                "description": c.description, "annotated": c.annotated,
                "sanitizer": self.sanitizer, "first_report": first_report(self.runs),
                "runs": [{"strategy": r.strategy, "seed": r.seed, "detected": r.detected,
                          "kinds": list(r.kinds), "error": r.error} for r in self.runs]}


def first_report(runs: List[Run]) -> Optional[str]:
    return next((r.first for r in runs if r.first), None)


def schedules(device: str, seed: int) -> List[Tuple[str, int]]:
    """The (strategy, seed) pairs a case runs under on ``device``."""
    from ..device import device_info
    if not device_info(device).replayable:
        return [("-", seed)]
    from ..device.sched import SEEDED
    return [("eager", seed)] + [(s, seed + i) for s in SEEDED for i in range(SEEDS_PER_STRATEGY)]


def run_once(case: Case, device: str, strategy: str, seed: int) -> Run:
    """Run ``case`` on a fresh runtime, synchronize, and collect what was found."""
    from ..device import AnnotationError, make_runtime

    rt = make_runtime(device, seed=seed, strategy=strategy)   # the strategy: replayable ones
    kinds, first, error = set(), None, None
    try:
        case.run(rt)
        rt.synchronize()
    except AnnotationError as e:
        kinds.add(ANNOTATION)
        first = f"annotation error: {e}"
    except Exception as e:  # a broken case or runtime: reported, never a verdict
        error = f"{type(e).__name__}: {e}"
    reports = list(rt.reports)
    kinds.update(r.kind for r in reports)
    if first is None and reports:
        first = str(reports[0])
    return Run(strategy, seed, bool(kinds), tuple(sorted(kinds)), error, first)


def judge(case: Case, runs: List[Run], sanitizer: Optional[str] = None) -> Verdict:
    """Decide whether ``case`` behaved as the catalogue says over ``runs``."""
    v = Verdict(case, runs, sanitizer)
    for r in runs:
        if r.error:
            v.problems.append(f"{r.strategy}/{r.seed}: {r.error}")
    if len({r.detected for r in runs}) > 1 or len({r.kinds for r in runs}) > 1:
        split = ", ".join(f"{r.strategy}/{r.seed}={'+'.join(r.kinds) or 'none'}" for r in runs)
        v.problems.append(f"verdict depends on the schedule: {split}")
    if v.detected != case.expect_race:
        v.problems.append("planted race not flagged" if case.expect_race
                          else "twin flagged: " + ", ".join(v.kinds))
    elif case.expect_race:
        extra = [k for k in v.kinds if k not in case.kinds]
        if extra:
            v.problems.append(f"reported as {', '.join(extra)}, expected "
                              f"{' or '.join(case.kinds)}")
    if sanitizer is not None and case.sanitizer:
        want = "flagged" if case.expect_race else "not flagged"
        if sanitizer != want:
            v.problems.append(f"PyTorch CUDA sanitizer: {sanitizer}, expected {want}")
    return v


def select(names: Optional[Iterable[str]] = None) -> List[Case]:
    """Catalogue cases in order, or only ``names`` (``KeyError`` on an unknown name)."""
    cases = catalogue()
    if not names:
        return list(cases.values())
    missing = [n for n in names if n not in cases]
    if missing:
        raise KeyError(", ".join(missing))
    return [cases[n] for n in names]


def run_case(case: Case, device: str = "sim", seed: int = 0,
             sanitizer: Optional[str] = None) -> Verdict:
    """Run one case under every schedule of ``device`` and judge it."""
    return judge(case, _runs(case, device, seed), sanitizer)


def _runs(case: Case, device: str, seed: int) -> List[Run]:
    return [run_once(case, device, st, sd) for st, sd in schedules(device, seed)]


def run_catalogue(device: str = "sim", seed: int = 0, names: Optional[Iterable[str]] = None,
                  with_sanitizer: bool = False, jobs: Optional[int] = None) -> List[Verdict]:
    """Judge every selected case; with ``with_sanitizer`` (cuda only), also run PyTorch's
    CUDA sanitizer on each stream<->stream case, one subprocess per case. The
    subprocesses run ``jobs`` at a time (default: up to 4, as CPUs allow) while this
    process runs the cases: each spends most of its time importing torch and starting a
    CUDA context, so one after another they took minutes."""
    cases = select(names)
    if with_sanitizer:
        from concurrent.futures import ThreadPoolExecutor
        from .sanitizer import check
        n = jobs or max(1, min(4, (os.cpu_count() or 1) // 2))
        with ThreadPoolExecutor(n) as pool:
            futures = {c.name: pool.submit(check, c.name) for c in cases if c.sanitizer}
            runs = [_runs(c, device, seed) for c in cases]
            return [judge(c, r, futures[c.name].result() if c.sanitizer else "n/a")
                    for c, r in zip(cases, runs)]
    return [run_case(c, device, seed, None) for c in cases]


def summary(verdicts: List[Verdict]) -> Dict[str, int]:
    """Counts for the summary line and the JSON output."""
    races = [v for v in verdicts if v.case.expect_race]
    twins = [v for v in verdicts if not v.case.expect_race]
    return {"cases": len(verdicts), "ok": sum(v.ok for v in verdicts),
            "races": len(races), "races_flagged": sum(v.detected for v in races),
            "twins": len(twins), "twins_flagged": sum(v.detected for v in twins),
            "failed": sum(not v.ok for v in verdicts)}
