"""The spec worker: enqueues one batch's device work and collects its result.

One batch, as DESIGN §4.1 lays it out, with no host sync inside:

* schedule stream: WAR barrier (wait until the previous forward finished reading the
  request->token table), non-blocking H2D of the staged metadata from pinned memory
  into fresh index buffers, request->token cell writes;
* forward stream: waits for the schedule stream; prefill, or resolve -> draft k ->
  verify -> accept -> draft-extend -> stash (the FutureMap); index buffers made on the
  schedule stream are pledged to it with ``record_stream``;
* copy stream: waits for the forward stream; non-blocking D2H of output tokens and
  accept lengths into pinned buffers; a copy-done event.

The host reads a batch's result only in ``collect``, after its copy-done event
(the declared sync). Staging and pinned result buffers are double-buffered by batch
parity: the host reuses them only after the batch two back was collected.
"""
from __future__ import annotations

from typing import List, Tuple

import torch

from . import canary as C
from . import kernels as K
from .buffers import DeviceState
from ..faults import FaultSet
from .drafts import make_drafter
from .types import PREFILL, SEEDED, Batch


class SpecWorker:
    def __init__(self, dev: DeviceState, model, requests):
        self.dev, self.model, self.requests = dev, model, requests
        cfg = dev.cfg
        self.k = cfg.spec_steps
        self.spec = cfg.spec
        self.drafter = make_drafter(cfg.draft_kind, dev, model) if cfg.spec else None
        self.declared_syncs = 0
        self.faults = FaultSet(cfg.faults)
        self.tags = C.tag_columns(model)   # KV canary on when the model tags its KV rows

    # -- host staging ----------------------------------------------------------------------
    def _stage(self, batch: Batch, p: int) -> Tuple[int, int]:
        dev, rt = self.dev, self.dev.rt
        meta = torch.zeros(dev.meta_pin[p].t.shape, dtype=torch.int64)
        ptok = torch.zeros(dev.ptok_pin[p].t.shape, dtype=torch.int64)
        n_tok = 0
        for i, e in enumerate(batch.entries):
            spec = self.requests[e.rid].spec
            meta[i] = torch.tensor([e.row, e.rid, spec.seed, int(spec.sampling == SEEDED),
                                    e.start, e.n, int(e.sample), int(e.last),
                                    e.next_token])
            for j, tok in enumerate(e.tokens):
                ptok[n_tok] = torch.tensor([e.row, e.start + j, tok, e.rid])
                n_tok += 1
        cells = torch.zeros(dev.cells_pin[p].t.shape, dtype=torch.int64)
        if batch.cells:
            cells[:len(batch.cells)] = torch.tensor(batch.cells, dtype=torch.int64)
        rt.host_write(dev.meta_pin[p], meta)
        rt.host_write(dev.cells_pin[p], cells)
        if batch.kind == PREFILL:
            rt.host_write(dev.ptok_pin[p], ptok)
        return len(batch.cells), n_tok

    # -- launch ------------------------------------------------------------------------------
    def launch(self, batch: Batch) -> List[str]:
        """Enqueue ``batch`` on the three streams; returns the op names in issue order."""
        dev, rt = self.dev, self.dev.rt
        p = batch.bid % 2
        sp = 0 if self.faults.on("single-staging-buffer") else p   # fault: one staging buffer
        n_cells, n_tok = self._stage(batch, sp)
        s, f, c = dev.sched, dev.fwd, dev.copy
        if not self.faults.on("no-war-barrier"):
            s.wait_event(dev.war)                               # WAR barrier
        staged = [dev.h2d(dev.meta_pin[sp], "meta")]
        cells_d = dev.h2d(dev.cells_pin[sp], "cells")
        staged.append(cells_d)
        ops = ["h2d"]
        if n_cells:
            rows = {r for r, _, _ in batch.cells}
            rt.launch(s, K.write_table, dev.table.t, cells_d.t, n_cells, name="write_table",
                      reads=[cells_d], writes=[dev.table.rows(rows)])
            ops.append("write_table")
        if batch.kind == PREFILL:
            staged.append(dev.h2d(dev.ptok_pin[sp], "prefill_tokens"))
        f.wait_stream(s)
        for buf in staged:
            if not self.faults.on("index-no-record-stream"):
                rt.record_stream(buf, f)
        out_tok = rt.empty(dev.tok_pin[p].t.shape, torch.int64, "out_tokens", f)
        out_acc = rt.empty(dev.acc_pin[p].t.shape, torch.int64, "out_accept", f)
        out_can = (rt.empty(dev.can_pin[p].t.shape, torch.int64, "out_canary", f)
                   if self.tags else None)
        step = _Step(batch, staged, out_tok, out_acc, n_tok, out_can)
        if batch.kind == PREFILL:
            ops += self._prefill(step)
        else:
            ops += self._decode(step)
        c.wait_stream(f)
        outs = [out_tok, out_acc] + ([out_can] if out_can is not None else [])
        for buf in outs:
            rt.record_stream(buf, c)
        rt.copy(dev.tok_pin[p], out_tok, c, non_blocking=True)
        rt.copy(dev.acc_pin[p], out_acc, c, non_blocking=True)
        if out_can is not None:
            rt.copy(dev.can_pin[p], out_can, c, non_blocking=True)
        dev.done[p].record(c)
        for buf in staged + outs:
            rt.free(buf)
        return ops + ["d2h"]

    def _prefill(self, st: "_Step") -> List[str]:
        dev, rt, b = self.dev, self.dev.rt, len(st.batch.entries)
        meta, ptok = st.staged[0], st.staged[2]
        kv_s = dev.target_kv.rows(st.batch.slots_read)
        rows = st.rows
        draft_kv = self.drafter.kv if self.drafter is not None else None
        kv_regions = [kv_s] + ([draft_kv.rows(st.batch.slots_read)] if draft_kv is not None else [])
        rt.launch(dev.fwd, K.prefill_write, self.model, dev.target_kv.t,
                  draft_kv.t if draft_kv is not None else None, dev.table.t, ptok.t, st.n_tok,
                  name="prefill", reads=[ptok, dev.table.rows(rows)], writes=kv_regions)
        rt.launch(dev.fwd, K.prefill_finish, self.model, dev.target_kv.t, dev.table.t,
                  dev.fm_tok.t, dev.fm_len.t, meta.t, st.out_tok.t, st.out_acc.t, b,
                  name="prefill_sample",
                  reads=[kv_s, dev.table.rows(rows), meta, dev.fm_tok.rows(rows),
                         dev.fm_len.rows(rows)],
                  writes=[st.out_tok, st.out_acc, dev.fm_tok.rows(rows), dev.fm_len.rows(rows)])
        ops = ["prefill", "prefill_sample"]
        if self.drafter is not None:
            ops += self.drafter.launch_prefill(st, meta, b)
        ops += self._canary(st, meta, True)
        dev.war.record(dev.fwd)
        return ops

    def _decode(self, st: "_Step") -> List[str]:
        dev, rt, b, k = self.dev, self.dev.rt, len(st.batch.entries), self.k
        meta, rows = st.staged[0], st.rows
        kv_s = dev.target_kv.rows(st.batch.slots_read)
        table_r = dev.table.rows(rows)
        fm = [dev.fm_tok.rows(rows), dev.fm_len.rows(rows)]
        rt.launch(dev.fwd, K.resolve, dev.fm_tok.t, dev.fm_len.t, meta.t, dev.drafts.t,
                  dev.lens.t, b, name="resolve", reads=fm + [meta],
                  writes=[dev.drafts, dev.lens])
        ops = ["resolve"]
        if self.faults.on("hidden-seq-lens-sync"):              # fault: a sync per decode
            self.seq_lens_sum = int(rt.to_host(dev.lens, dev.fwd)[:b].sum())
        if not self.spec:
            rt.launch(dev.fwd, K.decode, self.model, dev.target_kv.t, dev.table.t, meta.t,
                      dev.drafts.t, dev.lens.t, st.out_tok.t, st.out_acc.t, b, name="decode",
                      reads=[kv_s, table_r, meta, dev.drafts, dev.lens],
                      writes=[kv_s, st.out_tok, st.out_acc])
            ops += ["decode"] + self._canary(st, meta, False)
            dev.war.record(dev.fwd)
        else:
            ops += self.drafter.launch_drafts(st, meta, table_r, b)
            rt.launch(dev.fwd, K.verify, self.model, dev.target_kv.t, dev.table.t, meta.t,
                      dev.drafts.t, dev.lens.t, dev.tgt.t, k + 1, b, name="verify",
                      reads=[kv_s, table_r, meta, dev.drafts, dev.lens],
                      writes=[kv_s, dev.tgt])
            rt.launch(dev.fwd, K.accept, dev.drafts.t, dev.tgt.t, st.out_tok.t, st.out_acc.t,
                      k, b, name="accept", reads=[dev.drafts, dev.tgt],
                      writes=[st.out_tok, st.out_acc])
            early = self.faults.on("war-before-extend")
            if early:                                           # fault: before the last reads
                dev.war.record(dev.fwd)
            ops += ["verify", "accept"] + self.drafter.launch_extend(st, meta, table_r, b)
            ops += self._canary(st, meta, False)
            if not early:
                dev.war.record(dev.fwd)
        rt.launch(dev.fwd, K.stash, dev.fm_tok.t, dev.fm_len.t, meta.t, dev.lens.t,
                  st.out_tok.t, st.out_acc.t, b, name="stash",
                  reads=[meta, dev.lens, st.out_tok, st.out_acc], writes=fm)
        return ops + ["stash"]

    def _canary(self, st: "_Step", meta, prefill: bool) -> List[str]:
        """The KV canary record of this forward (before the WAR barrier's record: it
        reads the request->token table)."""
        if st.out_can is None:
            return []
        dev, rt = self.dev, self.dev.rt
        reads = [dev.target_kv.rows(st.batch.slots_read), dev.table.rows(st.rows), meta]
        rt.launch(dev.fwd, C.canary, dev.target_kv.t, dev.table.t, meta.t, dev.lens.t,
                  st.out_can.t, self.tags, len(st.batch.entries), prefill, name="canary",
                  reads=reads + ([] if prefill else [dev.lens]), writes=[st.out_can])
        return ["canary"]

    # -- result ------------------------------------------------------------------------------
    def collect(self, batch: Batch) -> Tuple[List[List[int]], List[int]]:
        """Wait for ``batch``'s copy-done event (a declared sync) and read its pinned
        results: per entry, the output tokens and the accept length."""
        dev, rt = self.dev, self.dev.rt
        p = batch.bid % 2
        if not self.faults.on("no-copy-done-wait"):
            dev.done[p].synchronize()
            self.declared_syncs += 1
        toks = rt.host_view(dev.tok_pin[p]).tolist()
        accs = rt.host_view(dev.acc_pin[p]).tolist()
        b = len(batch.entries)
        return toks[:b], accs[:b]

    def canary(self, batch: Batch):
        """``batch``'s KV canary records (one list per entry), or None when the model
        has no KV tags. Call after ``collect``: the copy-done wait covers them."""
        if not self.tags:
            return None
        rows = self.dev.rt.host_view(self.dev.can_pin[batch.bid % 2]).tolist()
        return rows[:len(batch.entries)]


class _Step:
    """Per-launch handles passed to the drafter."""

    __slots__ = ("batch", "staged", "out_tok", "out_acc", "n_tok", "rows", "out_can")

    def __init__(self, batch, staged, out_tok, out_acc, n_tok, out_can=None):
        self.batch, self.staged, self.n_tok = batch, staged, n_tok
        self.out_tok, self.out_acc, self.out_can = out_tok, out_acc, out_can
        self.rows = frozenset(e.row for e in batch.entries)
