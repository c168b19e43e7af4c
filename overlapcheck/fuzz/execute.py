"""Run one case through the engine with the checkers on, and say what was found.

Everything a finding needs to be reproduced comes back in the ``Outcome``: the
recorded schedule choices, the trace digest, and the findings deduplicated by
(checker, site). An exception from the engine itself is a finding of its own kind
(``engine-exception``), tallied apart from the checkers' violations.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import traceback
from dataclasses import dataclass, field
from typing import List, Optional

from invariants.drive import Halt

from ..device import Diverged, Replay, StuckWait, make_runtime
from ..engine import EngineStuck, RunResult, make_engine
from ..engine import events as E
from .case import Case
from .checks import CheckSession
from .finding import ENGINE_EXCEPTION, Finding



@dataclass
class Outcome:
    findings: List[Finding]
    choices: List[int]
    digest: str
    steps: int
    result: Optional[RunResult] = None
    diverged: Optional[str] = None
    retired: list = field(default_factory=list)
    marks: list = field(default_factory=list)  # (iteration, host call) at each step end


def _exception_finding(exc: BaseException, step: int) -> Finding:
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if any(p in f.filename for p in ("overlapcheck", "fake_models", "invariants"))]
    where = f"{os.path.basename(frames[-1].filename)}:{frames[-1].lineno}" if frames else "?"
    text = f"[{ENGINE_EXCEPTION}] step {step}: {type(exc).__name__}: {exc} (at {where})"
    return Finding(ENGINE_EXCEPTION, (type(exc).__name__, where), step, text)


def digest_of(result: Optional[RunResult], retired) -> str:
    h = hashlib.sha256()
    if result is not None:
        h.update(json.dumps(result.to_json(), sort_keys=True).encode())
    for stream, name, _ in retired:
        h.update(f"{stream}|{name};".encode())
    return h.hexdigest()[:16]


def run_case(case: Case, choices: Optional[List[int]] = None, device: str = "sim",
             model=None) -> Outcome:
    """Run ``case``; with ``choices``, replay them exactly (``Outcome.diverged`` says
    when the run no longer follows them)."""
    from fake_models import make_model
    strategy = Replay(choices) if choices is not None else case.schedule.make()
    rt = make_runtime(device, seed=case.seed, strategy=strategy, access="declared")
    if device == "sim":
        rt.trace = True
    session = CheckSession(case, rt)
    marks = []

    def observer(ev):
        session.feed(ev)
        if isinstance(ev, E.StepEnd):
            marks.append((ev.iteration, getattr(rt, "calls", 0)))

    cfg = dataclasses.replace(case.config, faults=tuple(dict.fromkeys(
        tuple(case.config.faults) + tuple(case.faults))))      # the case's faults switched on
    eng = make_engine(cfg, rt, model if model is not None else make_model(cfg.model), observer)
    result, diverged = None, None
    try:
        result = eng.run(case.workload)
    except Diverged as e:
        diverged = str(e)
    except Halt:
        pass   # a fatal checker (liveness) reported: its violation is a finding already
    except (EngineStuck, StuckWait) as e:
        session.stuck(eng.iteration, str(e))
    except Exception as e:  # noqa: BLE001 - the engine's own failure is a finding
        session.add(_exception_finding(e, eng.iteration))
    if diverged is None and isinstance(strategy, Replay) and not strategy.exhausted:
        diverged = (f"the run ended after {strategy.pos} of {len(strategy.choices)} "
                    f"recorded decisions")
    findings = [] if diverged else session.finish(result)
    retired = list(getattr(rt, "retired", []))
    return Outcome(findings, list(getattr(rt, "choices", [])), digest_of(result, retired),
                   eng.iteration, result, diverged, retired, marks)


def replace_schedule(case: Case, **kw) -> Case:
    return dataclasses.replace(case, schedule=dataclasses.replace(case.schedule, **kw))
