"""vllm-placeholders: vLLM's optimistic per-request counters agree with the batches
really in flight (the vLLM target's ``VllmFrame``/``VllmFrameDone``/``VllmCounters``).

vLLM's scheduler runs ahead of its outputs: ``num_computed_tokens`` counts scheduled
tokens before they are verified, ``num_output_placeholders`` (async) reserves the
tokens each in-flight sampling batch will emit (1 + drafts), ``num_in_flight_tokens``
counts every scheduled, unprocessed token, and after a preemption the in-flight share
becomes ``num_stale_output_tokens`` (delivered, never applied). From the batches the
runner ran and the ones not yet processed, this checker derives what each counter must
be at every step end:

* in flight == the request's tokens in unprocessed batches; stale == those of batches
  in flight when it was last preempted;
* placeholders == sum of (1 + drafts) over its non-stale unprocessed sampling batches
  (async), 0 (sync); never negative;
* a running request's ``num_computed_tokens`` == the positions the runner holds valid
  after its last batch + the drafts still to be rejected in its unprocessed batches; a
  waiting or preempted request has 0 computed tokens and no placeholders;
* the runner never sees a batch it cannot run: inputs past the tokens it knows, a
  request it was never given, KV writes past its block table, or draft slots with no
  drafts proposed after the request's previous batch (stale spec placeholders).
"""
from __future__ import annotations

from typing import Dict, List, Set, Tuple

from invariants.base import Checker, Violation
from overlapcheck.protocol import events as E

from .. import events as V


class VllmPlaceholders(Checker):
    name = "vllm-placeholders"
    targets = ("vllm",)

    def __init__(self, **context) -> None:
        super().__init__()
        # it reads the fake runner's frames; vLLM's own runner has none
        self.idle = context.get("vllm_runner") == "real"
        self.is_async = True
        self.frames: Dict[int, Dict[int, V.FrameEntry]] = {}     # in-flight batch -> rid -> entry
        self.stale: Set[Tuple[int, int]] = set()                 # (batch, rid)
        self.pos: Dict[int, int] = {}                            # rid -> valid positions after last batch
        self.noted: Set[Tuple[int, str]] = set()

    def _v(self, ev, rid: int, kind: str, msg: str, expected: str, seen: str) -> List[Violation]:
        if (rid, kind) in self.noted:
            return []
        self.noted.add((rid, kind))
        return [Violation(self.name, ev.iteration, f"request {rid}: {msg}", expected, seen,
                          (kind,), {"rid": rid})]

    def on_VllmSessionInfo(self, ev: V.VllmSessionInfo):
        self.is_async = ev.scheduler == "async"

    def on_VllmFrame(self, ev: V.VllmFrame) -> List[Violation]:
        out: List[Violation] = []
        self.frames[ev.batch] = {e.rid: e for e in ev.entries}
        for e in ev.entries:
            if e.kind == "unknown":
                out += self._v(ev, e.rid, "unknown-request", f"scheduled in batch {ev.batch} "
                               "but never handed to the runner", "a new-request entry first",
                               f"{e.n} tokens scheduled")
                continue
            if e.kind == "overrun":
                out += self._v(ev, e.rid, "input-overrun", f"batch {ev.batch} inputs run past "
                               "the tokens the runner knows", f"inputs end at {e.known}",
                               f"positions {e.start}..{e.start + e.n - e.spec - 1}")
            if -1 in e.blocks:
                out += self._v(ev, e.rid, "write-past-table", f"batch {ev.batch} writes KV "
                               "past the request's block table", f"positions < {e.table} blocks "
                               f"x block size", f"positions {e.start}..{e.start + e.n - 1}")
            if e.drafts == "stale":
                out += self._v(ev, e.rid, "stale-spec-placeholders", f"batch {ev.batch} has "
                               f"{e.spec} draft slots but no drafts were proposed after its "
                               "previous batch", "draft slots only after a batch that sampled",
                               f"{e.spec} draft slots at position {e.start}")
            self.pos[e.rid] = e.start + e.n - (e.spec - e.accepted if e.samples else 0)
        return out

    def on_VllmFrameDone(self, ev: V.VllmFrameDone):
        entries = self.frames.pop(ev.batch, {})
        for rid in entries:
            self.stale.discard((ev.batch, rid))

    def on_Retracted(self, ev: E.Retracted):
        for b, entries in self.frames.items():
            if ev.rid in entries:
                self.stale.add((b, ev.rid))
        self.pos.pop(ev.rid, None)

    def _left(self, ev):
        self.pos.pop(ev.rid, None)

    on_Finished = on_Aborted = _left

    def on_VllmCounters(self, ev: V.VllmCounters) -> List[Violation]:
        want: Dict[int, List[int]] = {}     # rid -> [in flight, stale, placeholders, rejections]
        for b, entries in self.frames.items():
            for rid, e in entries.items():
                w = want.setdefault(rid, [0, 0, 0, 0])
                w[0] += e.n
                if (b, rid) in self.stale:
                    w[1] += e.n
                elif e.samples:
                    w[2] += 1 + e.spec
                    w[3] += e.spec - e.accepted
        out: List[Violation] = []
        for c in ev.requests:
            inflight, stale, ph, rej = want.get(c.rid, (0, 0, 0, 0))
            if not self.is_async:
                ph = 0
            if c.num_output_placeholders < 0 or c.num_computed_tokens < 0:
                out += self._v(ev, c.rid, "negative", "a counter went negative",
                               "num_output_placeholders >= 0 and num_computed_tokens >= 0",
                               f"placeholders {c.num_output_placeholders}, "
                               f"computed {c.num_computed_tokens}")
            if c.num_in_flight_tokens != inflight:
                out += self._v(ev, c.rid, "in-flight", "num_in_flight_tokens differs from its "
                               "unprocessed batches", f"{inflight} (scheduled, unprocessed)",
                               f"{c.num_in_flight_tokens}")
            if c.num_stale_output_tokens != stale:
                out += self._v(ev, c.rid, "stale", "num_stale_output_tokens differs from the "
                               "batches in flight at its preemption", f"{stale}",
                               f"{c.num_stale_output_tokens}")
            if c.status == "RUNNING":
                if c.num_output_placeholders != ph:
                    out += self._v(ev, c.rid, "placeholders", "num_output_placeholders differs "
                                   "from its in-flight sampling batches",
                                   f"{ph} (1 + drafts per non-stale in-flight batch)",
                                   f"{c.num_output_placeholders}")
                pos = self.pos.get(c.rid)
                if pos is not None and c.num_computed_tokens != pos + rej:
                    out += self._v(ev, c.rid, "computed", "num_computed_tokens differs from "
                                   "the runner's valid positions plus pending rejections",
                                   f"{pos} + {rej} = {pos + rej}", f"{c.num_computed_tokens}")
            elif c.status in ("WAITING", "PREEMPTED"):
                if c.num_computed_tokens != 0 or c.num_output_placeholders != 0:
                    out += self._v(ev, c.rid, "waiting-counters", f"{c.status.lower()} with "
                                   "counters left over", "0 computed tokens, 0 placeholders",
                                   f"computed {c.num_computed_tokens}, placeholders "
                                   f"{c.num_output_placeholders}")
        return out
