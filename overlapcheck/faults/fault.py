"""One ``Fault`` type for every target's faults: what goes wrong, which public bug it
re-creates, which checker must catch it, what a run needs for it to show, and the
mechanism that switches it on."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Tuple

# the keys every fault lists (``Fault.to_dict``); a fault's own fields may not reuse them
_KEYS = ("name", "kind", "checker", "description", "cites", "trigger", "sites")


@dataclass(frozen=True)
class Fault:
    """A named bug a target can switch on, off by default. A fault counts as found only
    through ``checker``: nothing in the fuzzer knows fault names.

    * ``description``: what the faulty engine does (and, for a reverted fix, what the fix
      changed);
    * ``cites``: the public bug it re-creates (a fix's pull request and issue, or the bug
      class seen in public engines);
    * ``trigger``: what a run needs for the fault to matter (without it the fault is
      silent);
    * ``mechanism``: how it is switched on: a ``GuardedSite`` in an engine written for
      overlapcheck (``guard.py``), or a ``SourcePatch`` restoring a function's pre-fix
      source in a real engine (``patch.py``);
    * ``fields``: more (name, value) pairs the fault's target defines (the zoo's class
      number; a seed, a worker, a layer), listed with the rest."""

    name: str
    description: str
    cites: str
    checker: str
    trigger: str
    mechanism: object
    fields: Tuple[Tuple[str, object], ...] = ()

    def __post_init__(self) -> None:
        for key, _ in self.fields:
            if key in _KEYS:
                raise ValueError(f"fault {self.name}: field {key!r} is one every fault has")

    @property
    def extra(self) -> Dict[str, object]:
        """The target's own fields, by name."""
        return dict(self.fields)

    @property
    def sites(self) -> Tuple[str, ...]:
        """Where the mechanism acts (a guarded site, the patched functions)."""
        return self.mechanism.sites()

    def to_dict(self) -> dict:
        """The listing of ``overlapcheck faults --json``: the keys every fault has, the
        mechanism's own (under the names earlier listings used for them too), then the
        fault's own fields."""
        d = {"name": self.name, "kind": self.mechanism.kind, "checker": self.checker,
             "description": self.description, "cites": self.cites, "trigger": self.trigger,
             "sites": list(self.sites)}
        d.update(self.mechanism.fields(self))
        d.update(self.fields)
        return d
