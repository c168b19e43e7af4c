"""Draft kinds: the registry and the ``Drafter`` protocol every kind implements.

``DRAFT_KINDS`` maps a kind's name to its class (imported on first use, so that the
config, the command line and the fuzzer list the kinds without torch). Everything
else derives from it: ``EngineConfig`` validation, ``run --draft`` and ``fuzz --draft``
choices, the fuzzer's draws, the tests that go over every kind. A new kind is one
module and one entry here.

A drafter owns its draft-side buffers and enqueues its part of a prefill
(``launch_prefill``), the draft steps of one round (``launch_drafts``: at a decode's
start, or with zero bubble the next round's after the draft-extend; see
``drafts_round``) and the draft-extend of one decode batch; the worker does the rest.
"""
from __future__ import annotations

import importlib
from typing import Dict, List

try:
    from typing import Protocol
except ImportError:   # pragma: no cover
    Protocol = object

# kind -> "module:Class"
DRAFT_KINDS: Dict[str, str] = {
    "standalone": "overlapcheck.engine.drafts_standalone:StandaloneDraft",
    "eagle": "overlapcheck.engine.drafts_eagle:EagleDraft",
    "mtp": "overlapcheck.engine.drafts_mtp:MTPDraft",
}


class Drafter(Protocol):
    """What the worker and the scheduler ask of a draft kind."""

    kind: str
    #: the kind has draft KV of its own at the request's slots: the decode reserve is
    #: labelled ``draft`` in the ledger, and a pre-drafted (zero-bubble) round needs
    #: reserve for its draft KV. False (frozen-KV MTP): the reserve holds only the
    #: target KV the verify writes (``verify``), and a pre-drafted round needs none.
    owns_kv: bool
    #: positions from a round's start length at which its draft steps write KV
    ahead_writes: int
    #: a draft KV buffer at the target's slot indices that the prefill fills next to the
    #: target's (standalone); None when the kind fills its KV itself or has none
    kv: object
    #: the KV the kind keeps for the KV canary: (buffer, its tag columns, the shift of its
    #: tokens: the row at position p holds the token at p + shift), or None (no KV of its
    #: own, or rows without tags)
    canary_kv: object

    def __init__(self, dev, model) -> None: ...

    def launch_prefill(self, st, meta, b: int) -> List[str]:
        """Enqueue the kind's part of a prefill batch; returns the launch names."""

    def launch_drafts(self, st, meta, table_r, b: int, rnd) -> List[str]:
        """Enqueue the k draft steps of round ``rnd``; returns the launch names."""

    def launch_extend(self, st, meta, table_r, b: int) -> List[str]:
        """Enqueue the draft-extend after a verify; returns the launch names."""


def check_kind(kind: str) -> None:
    if kind not in DRAFT_KINDS:
        raise ValueError(f"draft_kind must be one of {', '.join(DRAFT_KINDS)}, got {kind!r}")


def drafter_class(kind: str) -> type:
    check_kind(kind)
    module, cls = DRAFT_KINDS[kind].split(":")
    return getattr(importlib.import_module(module), cls)


def make_drafter(kind: str, dev, model) -> Drafter:
    return drafter_class(kind)(dev, model)
