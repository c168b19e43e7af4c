"""The selftest catalogue: planted-race programs and their correctly synchronized twins.

A case is a small program written against the device runtime API only (streams,
events, buffers, ``launch``, copies, host accessors), so the same program runs on the
``sim`` and on the ``cuda`` backend. Each planted race mirrors a real overlap bug; its
twin is the same program with the fix (a wait, a ``record_stream``, a WAR barrier, a
correct annotation) or with a pattern that looks risky but is ordered by CUDA's rules.

Programs are registered in pairs with ``@pair(...)``; ``catalogue()`` returns every
case by name. A program takes ``(rt, fixed)``: ``fixed=False`` plants the race,
``fixed=True`` is the twin.
"""
from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from typing import Callable, Dict, Tuple

# Report kinds (overlapcheck.race.report.KINDS) plus the runtime's annotation check.
STREAM_STREAM = "stream-stream"
HOST_READ_BEFORE_COPY = "host-read-before-copy"
HOST_WRITE_DURING_COPY = "host-write-during-copy"
HOST_STREAM = "host-stream"
REUSE = "reuse"
ANNOTATION = "annotation"  # AnnotationError: a launch touched rows outside its annotation

_PROGRAM_MODULES = ("progs_stream", "progs_kv", "progs_host", "progs_reuse")


@dataclass(frozen=True)
class Case:
    """One catalogue entry.

    ``expect_race``: the program has a planted race (else it is a twin);
    ``kinds``: the report kinds a planted race may be flagged as (empty for twins);
    ``description``: the real bug (or the fix) the program mirrors, one line;
    ``twin``: the name of the other program of the pair;
    ``sanitizer``: a stream<->stream case: both conflicting accesses are kernels on two
    streams over the same tensor (or row view), which PyTorch's CUDA sanitizer can see,
    so on cuda it must flag the planted race and not the twin. Host-side cases and
    allocator reuse are invisible to it (its column shows n/a);
    ``annotated``: the program narrows accesses with ``reads=``/``writes=``.
    """

    name: str
    expect_race: bool
    kinds: Tuple[str, ...]
    description: str
    twin: str
    sanitizer: bool
    annotated: bool
    program: Callable

    def run(self, rt) -> None:
        """Issue the program on runtime ``rt`` (the caller synchronizes afterwards)."""
        self.program(rt)


# name -> Case, filled by @pair when the program modules are imported.
_CATALOGUE: Dict[str, Case] = {}


def pair(race_name: str, twin_name: str, *, kinds: Tuple[str, ...], race: str, twin: str,
         sanitizer: bool = False, annotated: bool = False):
    """Register ``program(rt, fixed)`` as a planted race (``fixed=False``) named
    ``race_name`` and its twin (``fixed=True``) named ``twin_name``; ``race`` and
    ``twin`` are their one-line descriptions. Returns the program unchanged."""

    def deco(program: Callable) -> Callable:
        for name, fixed, doc, other in ((race_name, False, race, twin_name),
                                        (twin_name, True, twin, race_name)):
            if name in _CATALOGUE:
                raise ValueError(f"duplicate selftest case {name!r}")
            _CATALOGUE[name] = Case(
                name=name, expect_race=not fixed, kinds=() if fixed else tuple(kinds),
                description=doc, twin=other, sanitizer=sanitizer, annotated=annotated,
                program=functools.partial(program, fixed=fixed))
        return program

    return deco


def catalogue() -> Dict[str, Case]:
    """Every case by name, planted races and twins interleaved pair by pair."""
    for mod in _PROGRAM_MODULES:
        importlib.import_module(f"{__package__}.{mod}")
    return dict(_CATALOGUE)


def poll(event, limit: int = 10_000) -> None:
    """Spin on ``event.query()`` as an engine's busy-wait does; fall back to
    ``event.synchronize()`` (the same ordering) if the device is slow to get there."""
    for _ in range(limit):
        if event.query():
            return
    event.synchronize()
