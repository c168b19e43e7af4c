"""The bug zoo: named re-creations of real overlap-scheduling bugs, off by default.

``FAULTS`` (name -> ``Fault``) documents each one; the engine receives the enabled
names through ``EngineConfig.faults`` and asks ``FaultSet.on(name)`` at each guarded
site. ``overlapcheck faults`` lists them.
"""
from __future__ import annotations

from typing import Iterable

from .registry import FAULTS, Fault

__all__ = ["FAULTS", "Fault", "FaultSet", "check_names"]


def check_names(names: Iterable[str]) -> None:
    """Raise ``ValueError`` (one line, listing the valid names) for an unknown fault."""
    for n in names:
        if n not in FAULTS:
            raise ValueError(f"unknown fault {n!r} (choose from {', '.join(sorted(FAULTS))})")


class FaultSet:
    """The faults enabled in one engine instance (immutable).

    ``on(name)`` is what a guarded site asks; asking for a name that is not in
    ``FAULTS`` is a programming error and raises, so a typo cannot silently disable
    a site."""

    __slots__ = ("_on",)

    def __init__(self, names: Iterable[str] = ()):
        names = tuple(names)
        check_names(names)
        self._on = frozenset(names)

    def on(self, name: str) -> bool:
        if name not in FAULTS:
            raise KeyError(f"guarded site asks for unknown fault {name!r}")
        return name in self._on

    def __bool__(self) -> bool:
        return bool(self._on)

    def __repr__(self) -> str:
        return f"FaultSet({', '.join(sorted(self._on))})"
