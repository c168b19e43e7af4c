"""The reference engine's live requests and batches (the shared names, states and
``RequestSpec`` are the protocol's, ``overlapcheck/protocol/types.py``).

Comments on ``Request`` fields say which component writes each one.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from ..protocol.types import ABORTED, FINISHED, WAITING, BatchId, RequestId, RequestSpec, Step


@dataclass
class Request:
    """A live request. Writers: S = scheduler, P = result processing, L = loop."""

    spec: RequestSpec
    state: str = WAITING                                 # S, P, L
    output: List[int] = field(default_factory=list)      # P: accepted tokens, cut at stop/length
    accept_lens: List[int] = field(default_factory=list)  # P: one per processed verify
    finish_reason: Optional[str] = None                  # P, L
    abort_requested: bool = False                        # L
    row: Optional[int] = None                            # S: request-pool row
    pages: List[int] = field(default_factory=list)       # S: KV pages, in row order
    host_pages: List[int] = field(default_factory=list)  # S: host-pool pages (kv_backup), likewise
    committed: int = 0        # S/P: KV positions holding accepted tokens, as the host knows it
    prefill_len: int = 0      # S: positions the current (re)prefill writes
    prefilled: int = 0        # S: positions of that prefill already launched
    inflight: List[BatchId] = field(default_factory=list)  # S/P: unprocessed batches it rides
    unprocessed_decodes: int = 0                         # S/P
    retractions: int = 0                                 # S
    # prefix cache (docs/design.md §4.13): the first ``shared`` of ``pages`` are the
    # tree's, locked through ``prefix_node`` while the request holds them
    shared: int = 0                                      # S
    prefix_node: object = None                           # S

    @property
    def rid(self) -> RequestId:
        return self.spec.rid

    @property
    def tokens(self) -> List[int]:
        return list(self.spec.prompt) + self.output

    @property
    def done(self) -> bool:
        return self.state in (FINISHED, ABORTED)


@dataclass(frozen=True)
class Entry:
    """One request's part of a batch. For a prefill: positions ``[start, start+n)``;
    ``last``: the chunk ends the prefill; ``sample``: it also samples the first output token;
    ``next_token``: for a re-prefill after retraction, the host-known next input."""

    rid: RequestId
    row: int
    start: int = 0
    n: int = 0
    sample: bool = False
    last: bool = False
    next_token: int = -1
    tokens: Tuple[int, ...] = ()
    shared: int = 0     # prefix cache: positions 0..shared-1 are cached KV (§4.13)


@dataclass
class Batch:
    """A launched batch; ``cells`` are the request->token cells its schedule-stream
    preparation writes: (row, position, slot)."""

    bid: BatchId
    iteration: Step
    kind: str
    entries: List[Entry]
    cells: List[Tuple[int, int, int]] = field(default_factory=list)
    slots_read: frozenset = frozenset()     # KV slots the forward may touch (host upper bound)
    handles: object = None                  # device-side handles of the launch (worker)
    host_cells: List[Tuple[int, int, int]] = field(default_factory=list)  # req->host-pool cells
    host_slots: frozenset = frozenset()     # host-pool slots its KV backup may write
    # forward thread: what its launch reads of the requests, taken before the handoff
    inputs: object = None
