"""Events only the vLLM target emits, beside the shared ones of
``overlapcheck.protocol.events``: what the fake model runner did with each batch and
the scheduler's per-request counters. The target's ``checkers`` read them;
the shared checkers ignore them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

from ...protocol.events import Event


@dataclass(frozen=True)
class VllmSessionInfo(Event):
    """Emitted first: the scheduler class ("async"/"sync"), the in-flight depth, the draft count and
    whether KV blocks may be written by a writer unordered with the model's stream
    (``unordered_writes``: deferred block frees are on, as with a KV-consumer
    connector, so a block must not change owner while a batch still writes it)."""

    scheduler: str
    depth: int
    spec_tokens: int
    block_size: int
    unordered_writes: bool
    faults: Tuple[str, ...]
    vocab: int = 64              # the fake model's vocabulary and draft agreement (percent),
    agreement: int = 70          # for checkers that recompute golden tokens


@dataclass(frozen=True)
class FrameEntry:
    """One request's part of a batch, as the fake runner ran it. ``start``: the first
    position the batch computes for it; ``n``: tokens scheduled (drafts included);
    ``spec``: draft slots scheduled; ``samples``: the batch reaches the end of the
    request's known tokens and samples; ``kind``: "chunk" (partial prefill), "prefill"
    (the first sample after (re)admission) or "decode"; ``drafts``: where the drafts came
    from ("none", "fresh": proposed after the request's previous batch, "pad": padding
    of a step that starts in the prefill, "stale": none proposed after the previous
    batch); ``accepted``: drafts accepted; ``tokens``: the tokens it emits;
    ``blocks``: the KV blocks its writes land in; ``known``: tokens known to the runner
    before the batch; ``table``: blocks in the runner's block table for it."""

    rid: int
    start: int
    n: int
    spec: int
    samples: bool
    kind: str
    drafts: str
    accepted: int
    tokens: Tuple[int, ...]
    blocks: Tuple[int, ...]
    known: int
    table: int


@dataclass(frozen=True)
class VllmFrame(Event):
    """A non-empty batch was scheduled and run by the fake runner (``batch`` is its id)."""

    entries: Tuple[FrameEntry, ...]


@dataclass(frozen=True)
class VllmFrameDone(Event):
    """The scheduler processed batch ``batch``'s output (``update_from_output``)."""


@dataclass(frozen=True)
class ReqCounters:
    rid: int
    status: str                    # vLLM's RequestStatus name
    num_computed_tokens: int
    num_tokens: int
    num_output_placeholders: int
    num_in_flight_tokens: int
    num_stale_output_tokens: int
    num_spec_token_ids: int


@dataclass(frozen=True)
class VllmCounters(Event):
    """The scheduler's per-request counters at the end of a host step (live requests,
    in request-id order); emitted right before ``StepEnd``."""

    requests: Tuple[ReqCounters, ...]
