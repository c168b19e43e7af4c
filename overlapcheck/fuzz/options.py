"""A campaign's options, and the parsing of its database specs: no engine, no
Hypothesis and no torch are imported here, so ``fuzz`` checks its flags in the time it
takes to start Python (its time box starts with the command; docs/design.md §6.5)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional, Sequence
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from .campaign import Found, Stats

SCHEMES = ("redis", "rediss")


def is_shared(spec: Optional[str]) -> bool:
    """Does ``spec`` name a shared (Redis) database rather than a folder?"""
    return bool(spec) and urlsplit(spec).scheme in SCHEMES


def split_specs(specs) -> tuple:
    """``(folder, redis address)`` from database specs (``--db``, ``--overlapcheck-db``:
    each a folder or a ``redis://`` address, at most one of each); ``ValueError`` (one
    line) otherwise."""
    local = shared = None
    for spec in specs or ():
        if is_shared(spec):
            if shared is not None:
                raise ValueError(f"two shared databases given ({shared}, {spec})")
            shared = spec
        elif "://" in spec:
            raise ValueError(f"{spec!r} is neither a folder nor redis://HOST:PORT[/N]")
        else:
            if local is not None:
                raise ValueError(f"two database folders given ({local}, {spec})")
            local = spec
    return local, shared


@dataclass
class Options:
    seconds: Optional[float] = 60.0
    examples: Optional[int] = None
    seed: int = 0
    device: str = "sim"
    target: str = "reference"
    models: Optional[Sequence[str]] = None        # reference engine: None is the oracle
    draft_kinds: Optional[Sequence[str]] = None   # reference engine: None, every kind
    checks: Sequence[str] = ()
    faults: Sequence[str] = ()
    out: Optional[str] = None
    db: Optional[str] = None
    batch: int = 25
    # with ``seconds``: shrinking's time past the budget (None: none); without, a cap
    # on shrinking one finding (None: Hypothesis' own)
    shrink_seconds: Optional[float] = None
    progress: Optional[Callable[[str], None]] = None
    shared_db: Optional[str] = None   # redis://HOST:PORT[/N], multiplexed with ``db``
    # where the time box starts (a ``time.monotonic()`` of this machine; None: when the
    # campaign is built): the command's start, so start-up counts against ``seconds``
    started: Optional[float] = None
    # (checker, site) keys of findings already known (``--known`` repros): they neither
    # fail an example nor are reported, so a campaign looks for other bugs
    known: frozenset = frozenset()
    # each finding as it is written: when first seen, and each time a smaller case of it
    # replaces its repro (the same ``Found``, updated)
    on_finding: Optional[Callable[["Found"], None]] = None
    # asked before each example and at each step: a reason to stop now (a signal's name)
    # or None; the campaign then ends as at the end of its time box
    stop: Optional[Callable[[], Optional[str]]] = None
    on_stats: Optional[Callable[["Stats"], None]] = None   # the figures, about once a second
    on_begin: Optional[Callable[[], None]] = None   # called as the first example is drawn
    graphs: bool = False   # a GPU device: model calls replay from CUDA graphs (§4.9)
    # a target's config fields held fixed (``fuzz --config``): ((field, value), ...)
    config: Optional[tuple] = None
