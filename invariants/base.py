"""What every checker shares: the violation object, the handler dispatch, the registry.

A checker is a pure consumer. It is fed the engine's observer events one at a time
(``feed``) and the end of the run (``finish``); it returns ``Violation`` objects and
never raises on a finding, never mutates the engine and never touches the device.
Handlers are methods named after the event class (``on_Allocated``), as in PyTorch's
CUDA sanitizer: one handler per event kind; events without a handler are ignored. The
monitor hands a batch's decode results over as one ``VerifiedBatch``; the default
handler feeds its ``Verified`` and ``Canary`` events one by one.

Checkers are built by name with ``make_checkers(names, **context)``; the context
(e.g. ``reference=`` a non-overlap ``RunResult`` for parity) is offered to every
checker's constructor, which takes what it knows and ignores the rest. A ``fatal``
checker's violation means the run cannot usefully go on (a zombie): the driver stops.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Sequence, Tuple


@dataclass(frozen=True)
class Violation:
    """A violated invariant. ``expected`` and ``seen`` are the two facts that
    conflict; ``site`` identifies the bug for deduplication (checker + where)."""

    checker: str
    step: int
    message: str
    expected: str = ""
    seen: str = ""
    site: tuple = ()
    details: Dict[str, object] = field(default_factory=dict, compare=False, hash=False)

    @property
    def key(self) -> tuple:
        return (self.checker,) + tuple(self.site)

    def __str__(self) -> str:
        lines = [f"[{self.checker}] step {self.step}: {self.message}"]
        if self.expected:
            lines.append(f"  expected: {self.expected}")
        if self.seen:
            lines.append(f"  seen:     {self.seen}")
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {"checker": self.checker, "step": self.step, "message": self.message,
                "expected": self.expected, "seen": self.seen, "site": list(map(str, self.site)),
                "details": {k: _plain(v) for k, v in self.details.items()}}


def _plain(v):
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, (list, tuple, set, frozenset)):
        return [_plain(x) for x in (sorted(v) if isinstance(v, (set, frozenset)) else v)]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    return str(v)


class Checker:
    """Base class: dispatch each event to ``on_<EventClass>``."""

    name = "?"
    fatal = False
    targets = ("*",)    # the targets whose events it reads ("*": every target)
    # nothing to check in this run's context (golden without a golden model, parity
    # without a reference): every handler would return nothing, so the monitor feeds
    # it no events (``finish`` is still called)
    idle = False

    def __init__(self, **context) -> None:
        self._handlers: Dict[type, object] = {}

    def feed(self, event) -> List[Violation]:
        cls = type(event)
        h = self._handlers.get(cls)
        if h is None:
            h = getattr(self, "on_" + cls.__name__, False)
            self._handlers[cls] = h
        if not h:
            return []
        return h(event) or []

    def on_VerifiedBatch(self, event) -> List[Tuple[int, Violation]]:
        """A run of a batch's decode results in one event (docs/design.md §5.4): by
        default, each ``Verified`` and ``Canary`` it stands for, in order. Returns each
        violation with the position of its event in ``event.events()`` (the monitor
        lists the run's violations by it, as the per-request events would have). A
        checker on the hot path overrides it with one loop over the run's columns, and
        gives the same as this."""
        out: List[Tuple[int, Violation]] = []
        for p, ev in enumerate(event.events()):
            for v in self.feed(ev) or ():
                out.append((p, v))
        return out

    def finish(self) -> List[Violation]:
        """The run ended; report what only the end can show."""
        return []


# checker name -> "module:Class"; each lives in its own module of this package.
REGISTRY: Dict[str, str] = {
    "kv-accounting": "invariants.kv_accounting:KVAccounting",
    "kv-lifetime": "invariants.kv_lifetime:KVLifetime",
    "kv-canary": "invariants.kv_canary:KVCanary",
    "stream-race": "invariants.stream_race:StreamRace",
    "parity": "invariants.parity:Parity",
    "metrics": "invariants.metrics:Metrics",
    "no-hidden-sync": "invariants.no_hidden_sync:NoHiddenSync",
    "lifecycle": "invariants.lifecycle:Lifecycle",
    "liveness": "invariants.liveness:Liveness",
    "rank-agreement": "invariants.rank_agreement:RankAgreement",
    "host-race": "invariants.host_race:HostRace",
    # oracles that do not trust the engine (docs/design.md §9.3)
    "golden": "invariants.golden:Golden",
    "accept-oracle": "invariants.accept_oracle:AcceptOracle",
    "kv-backup": "invariants.kv_backup:KVBackup",
    "runtime-memory": "invariants.runtime_memory:RuntimeMemory",
    # what strict mode asserted, and the modes the config turns on
    "pool-integrity": "invariants.pool_integrity:PoolIntegrity",
    "config-effect": "invariants.config_effect:ConfigEffect",
    # the vLLM target's (their events come from overlapcheck.targets.vllm)
    "vllm-placeholders": "invariants.vllm_placeholders:VllmPlaceholders",
    "vllm-golden": "invariants.vllm_golden:VllmGolden",
    "vllm-block-reuse": "invariants.vllm_block_reuse:VllmBlockReuse",
    "vllm-preempt-progress": "invariants.vllm_preempt_progress:VllmPreemptProgress",
    "vllm-overschedule": "invariants.vllm_overschedule:VllmOverschedule",
    "vllm-sched-after-end": "invariants.vllm_sched_after_end:VllmSchedAfterEnd",
    # the SGLang target's
    "sglang-golden": "invariants.sglang_golden:SglangGolden",
}


def check_names(names: Iterable[str]) -> None:
    """``ValueError`` (one line, listing the valid names) for an unknown checker."""
    for n in names:
        if n not in REGISTRY:
            raise ValueError(f"unknown checker {n!r} (choose from {', '.join(REGISTRY)})")


_CLASSES: Dict[str, type] = {}   # "module:Class" -> the class (every run builds its checkers)


def checker_class(name: str) -> type:
    check_names((name,))
    path = REGISTRY[name]
    cls = _CLASSES.get(path)
    if cls is None:
        module, attr = path.split(":")
        cls = _CLASSES[path] = getattr(importlib.import_module(module), attr)
    return cls


def names_for(target: str = "reference") -> List[str]:
    """Every registered checker that reads what ``target`` emits (its ``targets``)."""
    return [n for n in REGISTRY
            if {"*", target} & set(checker_class(n).targets)]


def make_checkers(names: Iterable[str] = (), target: str = "reference",
                  **context) -> List[Checker]:
    """Instantiate checkers by name (empty: every one for ``target``), each offered
    ``context``."""
    wanted = list(names) or names_for(target)
    check_names(wanted)
    return [checker_class(n)(**context) for n in wanted]


def feed_all(checkers: Sequence[Checker], event) -> List[Violation]:
    out: List[Violation] = []
    for c in checkers:
        out.extend(c.feed(event))
    return out
