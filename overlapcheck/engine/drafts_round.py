"""The draft round of a decode batch: drafted at the decode's start (the standard
schedule) or, with zero bubble, one decode ahead (seed 000, SGLang PR #21895).

Zero bubble (``EngineConfig.zero_bubble``): right after its draft-extend, inside the same
launch on the forward stream, a decode drafts the *next* round (from the bonus token and
the new committed length) and stashes its k draft tokens in the FutureMap
(``future_drafts``, rows indexed by request-pool row like ``future_token``). The next
decode starts with verify preparation that *restores* them instead of drafting. A request
without a pre-drafted round (its first decode after a (re)prefill, or a round that could
not be pre-drafted) has its drafts *built* at the decode's start, as in the standard
schedule; a batch may mix both (the kernels' ``gate`` columns). Drafts are pure functions
of (request, context), so tokens and accept lengths equal the standard schedule's.

The host keeps one flag per request, never a device value: set when the request rides a
decode that pre-drafts its next round, dropped when a (re)prefill of it is launched (the
host scheduled it). An aborted, finished or retracted request drops its pre-drafted round
with it: it never decodes again on that row without a new prefill.

Memory: a pre-draft writes draft KV (standalone, EAGLE; ``drafter.ahead_writes``) from
the next round's start length, up to k+1 positions past the current round's. The
scheduler reserves one round more in this mode; where that reserve is clamped at the row
end, or the request still lacks it, its next round is not pre-drafted (``AHEAD`` 0) and is
drafted at the next decode's start instead. Its pages stay pending-free while a decode
that pre-drafts for it is in flight, as for every in-flight write.

Host lengths (a model with ``reads_host_lens``): each draft round reads the host's
``seq_lens_cpu`` of the round it drafts (``HLEN``: the upper bound committed + (k+1) per
unprocessed decode). The pre-drafted round gets its own, refreshed bound (``HNEXT``: one
round more); the bug-zoo fault ``seq-lens-cpu-stale`` stages the current round's instead.
"""
from __future__ import annotations

from typing import List, Set

import torch

from ..protocol.types import PREFILL
from . import kernels as K
from .faults import FaultSet
from .types import Batch


class Round:
    """Where one draft round runs: its drafts scratch and start lengths (buffers), the
    meta column gating its entries (None: all of them), the column of its host lengths
    (None: the model does not read them); ``prefix`` names its launches. ``fcol`` and
    ``fslots``: the meta column and the FutureMap slots its first draft step reads the
    stashed draft input from (the step's resolve slots at the decode's start; for a
    pre-drafted round the slots this decode's draft-extend just stashed into)."""

    __slots__ = ("drafts", "lens", "gate", "hcol", "prefix", "fcol", "fslots")

    def __init__(self, drafts, lens, gate, hcol, prefix="", fcol=K.ROW, fslots=frozenset()):
        self.drafts, self.lens, self.gate, self.hcol, self.prefix = drafts, lens, gate, hcol, prefix
        self.fcol, self.fslots = fcol, fslots


class DraftRounds:
    """Host staging and launches of the draft rounds of one engine's decodes."""

    def __init__(self, dev, model, drafter, requests):
        cfg = dev.cfg
        self.dev, self.drafter, self.requests = dev, drafter, requests
        self.on = cfg.spec and cfg.zero_bubble
        self.k, self.step, self.ps = cfg.spec_steps, cfg.step_tokens, cfg.page_size
        self.host_lens = bool(getattr(model, "reads_host_lens", False))
        self.faults = FaultSet(cfg.faults)
        self.predrafted: Set[int] = set()      # requests whose next round is in the FutureMap
        self._now: List[int] = []              # this launch's NOW and AHEAD columns
        self._ahead: List[int] = []
        if self.on:
            rt, bs = dev.rt, cfg.max_running
            self.fm_drafts = rt.empty((dev.fm_slots, self.k), torch.int64, "future_drafts",
                                      dev.fwd)
            dev.future_buffer(self.fm_drafts)
            self.next_drafts = rt.empty((bs, self.k + 1), torch.int64, "next_drafts", dev.fwd)
            self.next_lens = rt.empty((bs,), torch.int64, "next_lens", dev.fwd)

    # -- host ------------------------------------------------------------------------------
    def columns(self, batch: Batch) -> List[List[int]]:
        """Per entry, the meta columns ``NOW, AHEAD, HLEN, HNEXT`` of ``batch``; updates
        the host flags (call once per launch, before the launch's rounds)."""
        if batch.kind == PREFILL:      # a (re)prefill: no pre-drafted round (ended ones pruned)
            fresh = {e.rid for e in batch.entries}
            self.predrafted = {rid for rid in self.predrafted
                               if rid not in fresh and not self.requests[rid].done}
            self._now, self._ahead = [], []
            return [[0, 0, 0, 0] for _ in batch.entries]
        cols = [self._entry(self.requests[e.rid]) for e in batch.entries]
        self._now, self._ahead = [c[0] for c in cols], [c[1] for c in cols]
        return cols

    def use(self, batch: Batch, cols: List[List[int]]) -> None:
        """Launch ``batch`` with the columns ``columns`` gave it earlier (a snapshot taken
        before the forward thread's handoff): this launch's NOW and AHEAD columns."""
        if batch.kind == PREFILL:
            self._now, self._ahead = [], []
        else:
            self._now, self._ahead = [c[0] for c in cols], [c[1] for c in cols]

    def _entry(self, r) -> List[int]:
        # unprocessed decodes before this batch (the scheduler counted this one already)
        hlen = r.committed + self.step * (r.unprocessed_decodes - 1)
        if not self.on:
            return [1, 0, hlen, 0]
        now = int(r.rid not in self.predrafted)
        reach = self.drafter.ahead_writes
        ahead = reach == 0 or len(r.pages) * self.ps >= hlen + self.step + reach
        if ahead:
            self.predrafted.add(r.rid)
        else:
            self.predrafted.discard(r.rid)
        stale = self.faults.on("seq-lens-cpu-stale")
        hnext = hlen if stale else hlen + self.step   # fault: not refreshed for it
        return [now, int(ahead), hlen, hnext]

    # -- device ----------------------------------------------------------------------------
    def launch_start(self, st, meta, table_r, b: int) -> List[str]:
        """The round verified by this decode: restored from the FutureMap for entries with
        a pre-drafted round, drafted now for the others."""
        dev, rt, ops = self.dev, self.dev.rt, []
        if self.on and not all(self._now):
            fm = self.fm_drafts.rows(st.fsrc)
            rt.launch(dev.fwd, K.restore, self.fm_drafts.t, meta.t, dev.drafts.t, self.k, b,
                      st.src, name="restore", reads=[fm, meta, dev.drafts], writes=[dev.drafts])
            ops.append("restore")
        if any(self._now):
            gate = None if all(self._now) else K.NOW
            rnd = Round(dev.drafts, dev.lens, gate, K.HLEN if self.host_lens else None,
                        fcol=st.src, fslots=st.fsrc)
            ops += self.drafter.launch_drafts(st, meta, table_r, b, rnd)
        return ops

    def launch_ahead(self, st, meta, table_r, b: int) -> List[str]:
        """Zero bubble, after the draft-extend: draft the next round and stash it."""
        if not self.on or not any(self._ahead):
            return []
        dev, rt = self.dev, self.dev.rt
        nd, nl = self.next_drafts, self.next_lens
        rt.launch(dev.fwd, K.ahead_start, meta.t, dev.lens.t, st.out_tok.t, st.out_acc.t, nd.t,
                  nl.t, b, name="next_input", reads=[meta, dev.lens, st.out_tok, st.out_acc],
                  writes=[nd, nl])
        gate = None if all(self._ahead) else K.AHEAD
        rnd = Round(nd, nl, gate, K.HNEXT if self.host_lens else None, "next_",
                    fcol=st.dst, fslots=st.fdst)
        ops = ["next_input"] + self.drafter.launch_drafts(st, meta, table_r, b, rnd)
        fm = self.fm_drafts.rows(st.fdst)
        rt.launch(dev.fwd, K.ahead_stash, self.fm_drafts.t, meta.t, nd.t, self.k, b, st.dst,
                  name="stash_drafts", reads=[meta, nd, fm], writes=[fm])
        return ops + ["stash_drafts"]
