"""A small checked run of the vLLM target, for its tests and bench until the shared run
driver takes targets: open a session, feed every event to the checkers, collect the
violations. ``CHECKERS`` lists the vLLM checkers as ``invariants.base.REGISTRY``
entries ("name" -> "module:Class"); ``SHARED`` the shared checkers that apply.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import List, Optional, Sequence

CHECKERS = {
    "vllm-placeholders": "invariants.vllm_placeholders:VllmPlaceholders",
    "vllm-golden": "invariants.vllm_golden:VllmGolden",
    "vllm-block-reuse": "invariants.vllm_block_reuse:VllmBlockReuse",
    "vllm-preempt-progress": "invariants.vllm_preempt_progress:VllmPreemptProgress",
    "vllm-overschedule": "invariants.vllm_overschedule:VllmOverschedule",
    "vllm-sched-after-end": "invariants.vllm_sched_after_end:VllmSchedAfterEnd",
}
# shared checkers whose events the target emits (kv-lifetime, kv-canary, stream-race,
# no-hidden-sync and rank-agreement need device or rank events it has none of)
SHARED = ("kv-accounting", "lifecycle", "liveness", "metrics", "parity")


def make(names: Sequence[str], **context) -> list:
    from invariants.base import REGISTRY
    out = []
    for n in names:
        path = CHECKERS.get(n) or REGISTRY.get(n)
        if path is None:
            raise ValueError(f"unknown checker {n!r}")
        module, cls = path.split(":")
        out.append(getattr(importlib.import_module(module), cls)(**context))
    return out


@dataclass
class Checked:
    result: object = None
    violations: List[object] = field(default_factory=list)
    error: Optional[BaseException] = None
    steps: int = 0
    choices: List[int] = field(default_factory=list)
    events: List[object] = field(default_factory=list)


def run_checked(cfg, workload, strategy=None, seed: int = 0, names: Sequence[str] = (),
                reference=None, keep_events: bool = False, stop_at_first: bool = False,
                target=None, **context) -> Checked:
    """Run ``workload`` with the named checkers (default: all vLLM + shared ones);
    ``reference``: a ``RunResult`` for parity; ``context``: more checker context (e.g.
    ``parity_accept=False``: a preemption resamples at a new position in vLLM, so accept
    lengths by verify index match the reference only where both runs preempted alike).
    An engine exception is kept in ``error``, not raised (the checkers' findings up to
    it stay)."""
    from ...device.sched import Eager
    from . import VllmTarget
    names = list(names) or list(CHECKERS) + list(SHARED)
    checkers = make(names, reference=reference, **context)
    out = Checked()

    class _Stop(Exception):
        pass

    def observe(ev) -> None:
        if keep_events:
            out.events.append(ev)
        for c in checkers:
            vs = c.feed(ev)
            if vs:
                out.violations.extend(vs)
                if stop_at_first:
                    raise _Stop()

    target = target or VllmTarget()
    session = target.open(cfg, strategy or Eager(), observe, seed)
    try:
        out.result = session.run(workload)
        for c in checkers:
            out.violations.extend(c.finish())
    except _Stop:
        pass
    except Exception as e:     # an engine exception: tallied apart from the checkers
        out.error = e
    out.steps, out.choices = session.iteration, list(session.choices)
    return out
