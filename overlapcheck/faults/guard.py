"""The guarded-site mechanism: a fault is an ``if faults.on(NAME):`` in an engine written
for overlapcheck (the reference engine's bug zoo), re-creating a bug class seen in
public engines; the engine is handed the names switched on and asks at each site."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Iterable, Tuple


@dataclass(frozen=True)
class GuardedSite:
    """``site``: the file (relative to the ``overlapcheck`` package) and the function
    holding the guard, ``"engine/worker.py SpecWorker.launch"``; a test checks that the
    function asks for the fault there."""

    site: str
    kind = "guarded-site"

    def sites(self) -> Tuple[str, ...]:
        return (self.site,)

    def fields(self, fault) -> dict:
        # the zoo's listing named these site, mechanism (what the faulty engine does)
        # and mirrors (the public bug class)
        return {"site": self.site, "mechanism": fault.description, "mirrors": fault.cites}


class Guards:
    """The faults switched on in one engine instance (immutable), out of ``known``.

    ``on(name)`` is what a guarded site asks; asking for a name that is not known is a
    programming error and raises, so a typo cannot silently disable a site."""

    __slots__ = ("_on", "_known")

    def __init__(self, names: Iterable[str], known: Collection[str]):
        names = tuple(names)
        check(names, known)
        self._on, self._known = frozenset(names), known

    def on(self, name: str) -> bool:
        if name not in self._known:
            raise KeyError(f"guarded site asks for unknown fault {name!r}")
        return name in self._on

    def __bool__(self) -> bool:
        return bool(self._on)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(sorted(self._on))})"


def check(names: Iterable[str], known: Collection[str]) -> None:
    """``ValueError`` (one line, listing the valid names) for a name not in ``known``."""
    for n in names:
        if n not in known:
            raise ValueError(f"unknown fault {n!r} (choose from {', '.join(sorted(known))})")
