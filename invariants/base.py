"""What every checker shares: the violation object, the handler dispatch, the registry.

A checker is a pure consumer. It is fed the engine's observer events one at a time
(``feed``) and the end of the run (``finish``); it returns ``Violation`` objects and
never raises on a finding, never mutates the engine and never touches the device.
Handlers are methods named after the event class (``on_Allocated``), as in PyTorch's
CUDA sanitizer: one handler per event kind; events without a handler are ignored. The
monitor hands a batch's decode results over as one ``VerifiedBatch``; the default
handler feeds its ``Verified`` and ``Canary`` events one by one.

Checkers are built by name with ``make_checkers(names, **context)``, out of
``REGISTRY``: the shared checkers of this package (``SHARED``) and every target's own
(``Target.checkers``: those reading the target's own events); the context
(e.g. ``reference=`` a non-overlap ``RunResult`` for parity) is offered to every
checker's constructor, which takes what it knows and ignores the rest. A ``fatal``
checker's violation means the run cannot usefully go on (a zombie): the driver stops.
"""
from __future__ import annotations

import importlib
from collections.abc import Mapping
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


# the shared checkers, name -> "module:Class": each lives in its own module of this
# package and reads the protocol's events only (``targets`` says whose it can read)
SHARED: Dict[str, str] = {
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
    "access-audit": "invariants.access_audit:AccessAudit",
    # oracles that do not trust the engine (docs/design.md §9.3)
    "golden": "invariants.golden:Golden",
    "accept-oracle": "invariants.accept_oracle:AcceptOracle",
    "kv-backup": "invariants.kv_backup:KVBackup",
    "runtime-memory": "invariants.runtime_memory:RuntimeMemory",
    # what strict mode asserted, and the modes the config turns on
    "pool-integrity": "invariants.pool_integrity:PoolIntegrity",
    "config-effect": "invariants.config_effect:ConfigEffect",
}


def _target_classes() -> list:
    """Every registered target's class (``overlapcheck.targets.TARGETS``, imported by
    name as every registry entry is: the adapters, not their engines)."""
    targets = importlib.import_module("overlapcheck.targets")
    out = []
    for path in targets.TARGETS.values():
        module, cls = path.split(":")
        out.append(getattr(importlib.import_module(module), cls))
    return out


def target_checkers(target: str) -> Dict[str, str]:
    """The checkers target ``target`` lists as its own (``Target.checkers``; none for a
    name the target registry does not know)."""
    path = importlib.import_module("overlapcheck.targets").TARGETS.get(target)
    if path is None:
        return {}
    module, cls = path.split(":")
    return dict(getattr(importlib.import_module(module), cls).checkers)


class _Registry(Mapping):
    """checker name -> "module:Class": the shared checkers, then each target's own in
    the order of the target registry. Derived, never kept by hand: a target adds its
    checkers by listing them (``Target.checkers``); rebuilt when the target registry
    changes."""

    def __init__(self) -> None:
        self._key, self._map = None, {}

    def _get(self) -> Dict[str, str]:
        targets = importlib.import_module("overlapcheck.targets")
        key = tuple(targets.TARGETS.items())
        if key != self._key:
            merged = dict(SHARED)
            for cls in _target_classes():
                for name, path in cls.checkers.items():
                    if name in merged:
                        raise ValueError(f"checker {name!r} of target {cls.name} is already "
                                         f"registered ({merged[name]})")
                    merged[name] = path
            self._key, self._map = key, merged
        return self._map

    def __getitem__(self, name: str) -> str:
        return self._get()[name]

    def __iter__(self):
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())

    def __repr__(self) -> str:
        return f"REGISTRY({self._get()!r})"


REGISTRY: Mapping = _Registry()


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
    """The checkers of a run on ``target``: every shared checker that reads what it
    emits (its ``targets``), then the target's own."""
    return [n for n in SHARED if {"*", target} & set(checker_class(n).targets)] + list(
        target_checkers(target))


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
