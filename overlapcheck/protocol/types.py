"""The words every target and checker shares about requests: ids, states and their
legal moves, finish reasons, sampling modes, batch kinds, and ``RequestSpec``, one
arrival of a workload.

A target's own live request and batch objects are its business (the reference
engine's are in ``overlapcheck/engine/types.py``); what crosses the protocol is these
names and the frozen events of ``events``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

RequestId = int
BatchId = int
Step = int

# Request states.
WAITING, PREFILLING, RUNNING, FINISHED, ABORTED = (
    "waiting", "prefilling", "running", "finished", "aborted")
LEGAL = {  # state -> states it may move to
    WAITING: (PREFILLING, ABORTED),
    PREFILLING: (RUNNING, ABORTED),
    RUNNING: (WAITING, FINISHED, ABORTED),   # running -> waiting: retraction
    FINISHED: (),
    ABORTED: (),
}

# Finish reasons.
STOP, LENGTH, ABORT = "stop", "length", "abort"

# Sampling modes.
GREEDY, SEEDED = "greedy", "seeded"
SAMPLING = (GREEDY, SEEDED)

# Batch kinds.
PREFILL, DECODE = "prefill", "decode"


@dataclass(frozen=True)
class RequestSpec:
    """One arrival of a workload: pure data."""

    rid: RequestId
    arrival: Step
    prompt: Tuple[int, ...]
    max_new_tokens: int
    stop_ids: Tuple[int, ...] = ()
    seed: int = 0
    sampling: str = GREEDY
