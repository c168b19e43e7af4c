"""Delta debugging for repros that did not come from Hypothesis (e.g. a GPU night).

The case is re-run on the sim with its *schedule spec* (not its recorded choices,
which stop fitting once the workload changes); a candidate is kept when the same
(checker, site) still shows. Passes, repeated until none helps or the run budget is
spent: drop chunks of requests (ddmin), drop aborts, drop stalls, then shrink each
request (fewer new tokens, shorter prompt, no stop ids, earlier arrival).
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Iterator, List, Optional, Tuple

from ..protocol import RequestSpec, Workload
from ..protocol.finding import same_bug
from ..run import Case
from ..run import Outcome, execute
from .format import Repro, current_commit


class _Budget(Exception):
    pass


class _Search:
    def __init__(self, r: Repro, max_runs: int):
        self.key = r.finding.key
        self.max_runs = max_runs
        self.runs = 0
        self.best: Optional[Tuple[Case, Outcome]] = None

    def test(self, case: Case) -> bool:
        if self.runs >= self.max_runs:
            raise _Budget()
        self.runs += 1
        out = execute(case)
        if any(same_bug(self.key, f.key) for f in out.findings):
            self.best = (case, out)
            return True
        return False


def _with_requests(case: Case, reqs: List[RequestSpec]) -> Case:
    keep = {r.rid for r in reqs}
    w = Workload(tuple(reqs), tuple(a for a in case.workload.aborts if a.rid in keep))
    return dataclasses.replace(case, workload=w)


def _ddmin_requests(s: _Search, case: Case) -> Case:
    reqs = list(case.workload.requests)
    n = 2
    while len(reqs) >= 2:
        chunk = max(1, len(reqs) // n)
        progressed = False
        for i in range(0, len(reqs), chunk):
            cand = reqs[:i] + reqs[i + chunk:]
            if cand and s.test(_with_requests(case, cand)):
                reqs, progressed = cand, True
                n = max(n - 1, 2)
                break
        if not progressed:
            if chunk == 1:
                break
            n = min(len(reqs), n * 2)
    return _with_requests(case, reqs)


def _variants(spec: RequestSpec) -> Iterator[RequestSpec]:
    if spec.max_new_tokens > 1:
        yield dataclasses.replace(spec, max_new_tokens=max(1, spec.max_new_tokens // 2))
        yield dataclasses.replace(spec, max_new_tokens=spec.max_new_tokens - 1)
    if len(spec.prompt) > 1:
        yield dataclasses.replace(spec, prompt=spec.prompt[:max(1, len(spec.prompt) // 2)])
        yield dataclasses.replace(spec, prompt=spec.prompt[:-1])
    if spec.stop_ids:
        yield dataclasses.replace(spec, stop_ids=())
    if spec.arrival > 0:
        yield dataclasses.replace(spec, arrival=spec.arrival - 1)


def _shrink_each(s: _Search, case: Case) -> Case:
    reqs = list(case.workload.requests)
    for i in range(len(reqs)):
        improved = True
        while improved:
            improved = False
            for v in _variants(reqs[i]):
                cand = reqs[:i] + [v] + reqs[i + 1:]
                if s.test(_with_requests(case, cand)):
                    reqs, improved = cand, True
                    break
    return _with_requests(case, reqs)


def _drop_each(s: _Search, case: Case, items: list, rebuild: Callable[[list], Case]) -> Case:
    i = 0
    while i < len(items):
        cand = items[:i] + items[i + 1:]
        if s.test(rebuild(cand)):
            items = cand
        else:
            i += 1
    return rebuild(items)


def minimize(r: Repro, max_runs: int = 400) -> Tuple[Optional[Repro], int]:
    """The smallest repro found within ``max_runs`` engine runs (None when the
    finding does not show at all on the sim with the repro's schedule spec)."""
    s = _Search(r, max_runs)
    case = r.case
    try:
        if not s.test(case):
            return None, s.runs
        while True:
            before = s.runs
            size = _size(case)
            case = _ddmin_requests(s, case)
            case = _drop_each(s, case, list(case.workload.aborts), lambda a: dataclasses.replace(
                case, workload=Workload(case.workload.requests, tuple(a))))
            if case.schedule.kind == "stalls":
                case = _drop_each(s, case, list(case.schedule.stalls), lambda st: dataclasses.replace(
                    case, schedule=dataclasses.replace(case.schedule, stalls=tuple(st))))
            case = _shrink_each(s, case)
            if _size(case) >= size or s.runs == before:
                break
    except _Budget:
        pass
    case, out = s.best
    f = next(f for f in out.findings if same_bug(s.key, f.key))
    return Repro(case, out.choices, f, out.digest, "sim", out.steps, current_commit(),
                 note=f"minimized from {len(r.case.workload.requests)} requests in {s.runs} runs",
                 engine_version=r.engine_version), s.runs


def _size(case: Case) -> int:
    w = case.workload
    return (len(w.requests) * 1000 + len(w.aborts) * 100 + len(case.schedule.stalls) * 10
            + sum(len(q.prompt) + q.max_new_tokens + len(q.stop_ids) + q.arrival for q in w.requests))
