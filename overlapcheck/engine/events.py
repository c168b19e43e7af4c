"""The engine's observation API: typed events and per-step snapshots.

The engine calls ONE optional observer, ``observer(event)``, with these frozen
events. Every event carries ``iteration`` (the host step) and ``batch`` (the batch it
concerns: the one being built, launched or processed; -1 when none). Checkers consume
them and never reach into the engine.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Tuple

from .types import BatchId, RequestId, Step


@dataclass(frozen=True)
class Event:
    iteration: Step
    batch: BatchId


@dataclass(frozen=True)
class Arrived(Event):
    rid: RequestId


@dataclass(frozen=True)
class Scheduled(Event):
    """A batch was built: ``kind`` prefill/decode; ``rids`` in batch order."""

    kind: str
    rids: Tuple[RequestId, ...]


@dataclass(frozen=True)
class Allocated(Event):
    """``rid`` got KV ``slots`` (page aligned) for ``purpose``; ``row``: its request row."""

    rid: RequestId
    purpose: str
    slots: Tuple[int, ...]
    row: int


@dataclass(frozen=True)
class Freed(Event):
    """``rid``'s slots left it: ``pending`` until batch ``until`` is processed, else free
    now. ``reason``: finish, abort or retract."""

    rid: RequestId
    slots: Tuple[int, ...]
    reason: str
    pending: bool
    until: Optional[BatchId]


@dataclass(frozen=True)
class PendingReleased(Event):
    """Pending-free slots went back to the free list after ``batch`` was processed."""

    slots: Tuple[int, ...]


@dataclass(frozen=True)
class RowAssigned(Event):
    rid: RequestId
    row: int


@dataclass(frozen=True)
class RowReleased(Event):
    rid: RequestId
    row: int


@dataclass(frozen=True)
class Launched(Event):
    """A batch's device work was enqueued (``ops``: launch names in issue order)."""

    kind: str
    ops: Tuple[str, ...]


@dataclass(frozen=True)
class Prefilled(Event):
    """A prefill result was processed: ``token`` is the first output token (or -1 when
    the chunk did not sample); ``dropped``: the request had left the batch's state."""

    rid: RequestId
    token: int
    dropped: bool


@dataclass(frozen=True)
class Verified(Event):
    """A decode result of ``rid`` was processed. ``index``: the request's own verify
    count (0-based) when kept; ``accept_len`` as the device computed it; ``tokens``:
    the tokens appended (cut at a stop token or the length limit); ``dropped``: the
    result rode a batch after the request finished, aborted or was retracted."""

    rid: RequestId
    index: int
    accept_len: int
    tokens: Tuple[int, ...]
    dropped: bool


@dataclass(frozen=True)
class Finished(Event):
    rid: RequestId
    reason: str
    tokens: Tuple[int, ...]


@dataclass(frozen=True)
class Aborted(Event):
    rid: RequestId
    tokens: Tuple[int, ...]


@dataclass(frozen=True)
class Retracted(Event):
    rid: RequestId
    committed: int


@dataclass(frozen=True)
class ReqState:
    rid: RequestId
    state: str
    row: Optional[int]
    committed: int
    allocated: int
    output_len: int
    inflight: Tuple[BatchId, ...]


@dataclass(frozen=True)
class Snapshot:
    """Host-side state at the end of a step; every count is in KV slots.
    ``ledger``: (slot, rid, purpose, allocating step) for owned and pending slots."""

    total: int
    free: int
    owned: int
    pending: int
    ledger: Tuple[Tuple[int, RequestId, str, Step], ...]
    pending_slots: Tuple[int, ...]
    requests: Tuple[ReqState, ...]
    inflight: Tuple[BatchId, ...]
    rows_free: int
    idle: bool
    syncs: int
    declared_syncs: int


@dataclass(frozen=True)
class StepEnd(Event):
    snapshot: Snapshot


Observer = Callable[[Event], None]
