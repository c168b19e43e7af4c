"""The spec worker: enqueues one batch's device work and collects its result.

One batch, as docs/design.md §4.6 lays it out, with no host sync inside:

* schedule stream: WAR barrier (wait until the previous forward finished reading the
  request->token table), non-blocking H2D of the staged metadata from pinned memory
  into fresh index buffers, request->token cell writes;
* forward stream: waits for the schedule stream; prefill, or resolve -> draft k (or,
  zero bubble, restore the round pre-drafted by the previous decode) -> verify -> accept
  -> draft-extend (-> draft the next round) -> stash (the FutureMap); index buffers made
  on the schedule stream are pledged to it with ``record_stream``;
* copy stream: waits for the forward stream; non-blocking D2H of output tokens and
  accept lengths into pinned buffers; a copy-done event.

The host reads a batch's result only in ``collect``, after its copy-done event
(the declared sync). Staging and pinned result buffers are double-buffered by batch
parity: the host reuses them only after the batch two back was collected.
"""
from __future__ import annotations

from typing import List, Tuple

import torch

from ..protocol.types import PREFILL, SEEDED
from . import backup_check as BK
from . import canary as C
from . import kernels as K
from .buffers import DeviceState
from .drafts import make_drafter
from .drafts_round import DraftRounds
from .faults import FaultSet
from .future_map import make_future_map
from .types import Batch


class SpecWorker:
    def __init__(self, dev: DeviceState, model, requests, canary: bool = True):
        self.dev, self.model, self.requests = dev, model, requests
        cfg = dev.cfg
        self.k = cfg.spec_steps
        self.spec = cfg.spec
        self.future = make_future_map(cfg, requests)
        # meta columns of the FutureMap slot an entry resolves from / stashes into
        self.src, self.dst = (K.FSRC, K.FDST) if self.future.ring else (K.ROW, K.ROW)
        self.pfx = K.pfx_column(cfg)     # prefix cache: the shared prefix length column
        self.drafter = make_drafter(cfg.draft_kind, dev, model) if cfg.spec else None
        self.rounds = DraftRounds(dev, model, self.drafter, requests) if cfg.spec else None
        self.declared_syncs = 0
        self.faults = FaultSet(cfg.faults)
        self.backup = cfg.kv_backup
        # the host reads seq_lens_sum from the previous verify (verify_sync), or, under the
        # fault verify-sum-unwaited, from its published lengths without the wait
        self.host_sum = cfg.overlap and cfg.spec and (
            cfg.verify_sync or self.faults.on("verify-sum-unwaited"))
        self._published = None   # (bid, parity, {rid: index}) of the newest publishing batch
        self.host_sums = 0       # decode batches whose seq_lens_sum the host computed
        # KV canary on when asked for and the model tags its KV rows
        self.tags = C.tag_columns(model) if canary else None
        # the KV backup's canary (backup_check): spans kept, host pool read back
        self.backup_canary = self.backup and cfg.backup_canary and self.tags is not None
        if self.backup_canary:
            BK.allocate_spans(dev)
        # the draft KV's canary: the KV a draft kind keeps, when its rows carry tags
        # (``Drafter.canary_kv``: buffer, tag columns, token shift); None otherwise
        self.draft_canary = (getattr(self.drafter, "canary_kv", None)
                             if self.tags and self.drafter is not None else None)

    # -- host staging ----------------------------------------------------------------------
    def inputs(self, batch: Batch, unprocessed) -> "Inputs":
        """Everything launching ``batch`` reads of the requests (and the host launch state
        derived from them), taken now: the forward thread's batch carries it, taken on the
        scheduler thread before the handoff (docs/design.md §4.14), so that the forward
        thread reads no request the scheduler thread goes on mutating. ``unprocessed``:
        the batches not yet processed now (whose verified lengths the host cannot know)."""
        known = ({e.rid: self.requests[e.rid].committed for e in batch.entries}
                 if self.host_sum and batch.kind != PREFILL else None)
        rounds = self.rounds.columns(batch) if self.rounds else None
        fut = self.future.assign(batch)
        specs = [(sp.seed, int(sp.sampling == SEEDED))
                 for sp in (self.requests[e.rid].spec for e in batch.entries)]
        return Inputs(known, rounds, fut, specs, frozenset(unprocessed))

    def _lens_sum(self, batch: Batch) -> int:
        """The host's seq_lens_sum of a decode batch (0 when the device computes it).
        Lengths of requests that rode the previous, unprocessed decode batch come from its
        verify: the host waits for it (the declared verify sync) and reads them."""
        if not self.host_sum or batch.kind == PREFILL:
            return 0
        self.host_sums += 1
        inp = batch.inputs
        known = (dict(inp.known) if inp is not None else
                 {e.rid: self.requests[e.rid].committed for e in batch.entries})
        published = self._published
        if inp is not None and published is not None and published[0] not in inp.unprocessed:
            published = None     # processed before the snapshot: its lengths are in it
        if published is not None:
            _, pp, index = published
            if not self.faults.on("verify-sum-unwaited"):
                self.dev.verified[pp].synchronize()
                self.declared_syncs += 1
            lens = self.dev.rt.host_list(self.dev.lens_pin[pp])
            known.update({rid: lens[i] for rid, i in index.items() if rid in known})
        # summed as the device would, in int64 (an in-flight read may be poison)
        return int(torch.tensor(list(known.values()), dtype=torch.int64).sum())

    def _stage(self, batch: Batch, p: int) -> Tuple[int, int, list]:
        dev, rt = self.dev, self.dev.rt
        lsum = self._lens_sum(batch)
        bs = dev.meta_pin[p].t.shape[0]
        entries = batch.entries
        inp = batch.inputs
        if inp is None:      # read the requests now
            rounds = self.rounds.columns(batch) if self.rounds else [[1, 0, 0, 0]] * bs
            fut = self.future.assign(batch)
            specs = [(sp.seed, int(sp.sampling == SEEDED))
                     for sp in (self.requests[e.rid].spec for e in entries)]
        else:                # the snapshot taken before the handoff
            rounds = inp.rounds if self.rounds else [[1, 0, 0, 0]] * bs
            if self.rounds:
                self.rounds.use(batch, rounds)
            fut, specs = inp.fut, inp.specs
        ring = self.future.ring
        meta, ptok = [], []
        for i, e in enumerate(entries):
            meta.append([e.row, e.rid, specs[i][0], specs[i][1], e.start, e.n,
                         int(e.sample), int(e.last), e.next_token, lsum] + rounds[i]
                        + (list(fut[i]) if ring else [])
                        + ([e.shared] if self.pfx is not None else []))
            row, start, rid = e.row, e.start, e.rid
            ptok += [[row, start + j, tok, rid] for j, tok in enumerate(e.tokens)]
        staged = K.table_cells(batch.cells, dev.table.t.shape)
        rt.host_write(dev.meta_pin[p], _staged(meta, dev.meta_pin[p].t.shape))
        rt.host_write(dev.cells_pin[p], _staged(staged, dev.cells_pin[p].t.shape))
        if batch.kind == PREFILL:
            rt.host_write(dev.ptok_pin[p], _staged(ptok, dev.ptok_pin[p].t.shape))
        if self.backup and batch.host_cells:
            host = K.table_cells(batch.host_cells, dev.host_table.t.shape)
            rt.host_write(dev.hcells_pin[p], _staged(host, dev.hcells_pin[p].t.shape))
        return len(staged), len(ptok), fut

    # -- launch ------------------------------------------------------------------------------
    def launch(self, batch: Batch) -> List[str]:
        """Enqueue ``batch`` on the three streams; returns the op names in issue order."""
        dev, rt = self.dev, self.dev.rt
        p = batch.bid % 2
        sp = 0 if self.faults.on("single-staging-buffer") else p   # fault: one staging buffer
        n_cells, n_tok, fut = self._stage(batch, sp)
        s, f, c = dev.sched, dev.fwd, dev.copy
        waits_backup = self.backup and not self.faults.on("backup-not-waited")
        if not self.faults.on("no-war-barrier"):
            s.wait_event(dev.war)                               # WAR barrier
            if waits_backup:
                s.wait_event(dev.backup_done)    # the pending backup reads the tables too
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
        if self.backup and batch.host_cells:
            staged.append(self._write_host_table(batch, sp))
        f.wait_stream(s)
        if waits_backup:
            f.wait_event(dev.backup_done)          # the pending backup of the last forward
        for buf in staged:
            if not self.faults.on("index-no-record-stream"):
                rt.record_stream(buf, f)
        out_tok = rt.empty(dev.tok_pin[p].t.shape, torch.int64, "out_tokens", f)
        out_acc = rt.empty(dev.acc_pin[p].t.shape, torch.int64, "out_accept", f)
        out_can = (rt.empty(dev.can_pin[p].t.shape, torch.int64, "out_canary", f)
                   if self.tags else None)
        step = _Step(batch, staged, out_tok, out_acc, n_tok, out_can, fut, (self.src, self.dst))
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

    def _write_host_table(self, batch: Batch, sp: int):
        dev, rt = self.dev, self.dev.rt
        hcells = dev.h2d(dev.hcells_pin[sp], "host_cells")
        n = len(K.table_cells(batch.host_cells, dev.host_table.t.shape))
        rt.launch(dev.sched, K.write_table, dev.host_table.t, hcells.t, n,
                  name="write_host_table", reads=[hcells],
                  writes=[dev.host_table.rows({r for r, _, _ in batch.host_cells})])
        return hcells

    def _backup(self, st: "_Step", meta) -> List[str]:
        """Back the accepted positions' KV up to the host pool on the backup stream,
        after the forward's done-event; the next forward waits for ``backup_done``."""
        dev, rt, b = self.dev, self.dev.rt, len(st.batch.entries)
        dev.forward_done.record(dev.fwd)
        dev.backup.wait_event(dev.forward_done)
        for buf in (meta, st.out_acc):
            rt.record_stream(buf, dev.backup)
        rt.launch(dev.backup, K.backup_kv, dev.target_kv.t, dev.host_kv.t, dev.table.t,
                  dev.host_table.t, meta.t, dev.lens.t, st.out_acc.t, self.k + 1 if self.spec else 1,
                  b, name="backup_kv",
                  reads=[dev.target_kv.rows(st.batch.slots_read), dev.table.rows(st.rows),
                         dev.host_table.rows(st.rows), meta, dev.lens, st.out_acc],
                  writes=[dev.host_kv.rows(st.batch.host_slots)])
        ops = ["backup_kv"]
        if self.backup_canary:
            span = dev.backup_span.rows(st.rows)
            rt.launch(dev.backup, BK.note_backup, dev.backup_span.t, meta.t, dev.lens.t,
                      st.out_acc.t, b, name="note_backup",
                      reads=[span, meta, dev.lens, st.out_acc], writes=[span])
            ops.append("note_backup")
        dev.backup_done.record(dev.backup)
        return ops

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
        fm = [dev.fm_tok.rows(st.fdst), dev.fm_len.rows(st.fdst)]
        rt.launch(dev.fwd, K.prefill_finish, self.model, dev.target_kv.t, dev.table.t,
                  dev.fm_tok.t, dev.fm_len.t, meta.t, st.out_tok.t, st.out_acc.t, b, self.dst,
                  name="prefill_sample", reads=[kv_s, dev.table.rows(rows), meta] + fm,
                  writes=[st.out_tok, st.out_acc] + fm)
        ops = ["prefill", "prefill_sample"]
        if self.backup_canary:
            span = dev.backup_span.rows(rows)
            rt.launch(dev.fwd, BK.reset_span, dev.backup_span.t, meta.t, b, name="reset_span",
                      reads=[meta, span], writes=[span])
            ops.append("reset_span")
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
        rt.launch(dev.fwd, K.resolve, dev.fm_tok.t, dev.fm_len.t, meta.t, dev.drafts.t,
                  dev.lens.t, b, self.src, name="resolve",
                  reads=[dev.fm_tok.rows(st.fsrc), dev.fm_len.rows(st.fsrc), meta],
                  writes=[dev.drafts, dev.lens])
        rt.launch(dev.fwd, K.seq_lens_sum, meta.t, dev.lens.t, dev.lens_sum.t, b, self.host_sum,
                  name="seq_lens_sum", reads=[meta, dev.lens], writes=[dev.lens_sum])
        ops = ["resolve", "seq_lens_sum"]
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
            ops += self.rounds.launch_start(st, meta, table_r, b)
            verify_ops = ["verify", "accept"]       # op names, listed after the publish
            if dev.cfg.tree:
                verify_ops = self._tree_verify(st, meta, kv_s, table_r)
            else:
                rt.launch(dev.fwd, K.verify, self.model, dev.target_kv.t, dev.table.t, meta.t,
                          dev.drafts.t, dev.lens.t, dev.tgt.t, k + 1, b, name="verify",
                          reads=[kv_s, table_r, meta, dev.drafts, dev.lens],
                          writes=[kv_s, dev.tgt])
                rt.launch(dev.fwd, K.accept, dev.drafts.t, dev.tgt.t, st.out_tok.t,
                          st.out_acc.t, k, b, name="accept", reads=[dev.drafts, dev.tgt],
                          writes=[st.out_tok, st.out_acc])
            if self.host_sum:
                ops += self._publish(st)
            early = self.faults.on("war-before-extend")
            if early:                                           # fault: before the last reads
                dev.war.record(dev.fwd)
            ops += verify_ops + self.drafter.launch_extend(st, meta, table_r, b)
            ops += self.rounds.launch_ahead(st, meta, table_r, b)   # zero bubble
            ops += self._canary(st, meta, False)
            if not early:
                dev.war.record(dev.fwd)
        rt.launch(dev.fwd, K.stash, dev.fm_tok.t, dev.fm_len.t, meta.t, dev.lens.t,
                  st.out_tok.t, st.out_acc.t, b, self.dst, name="stash",
                  reads=[meta, dev.lens, st.out_tok, st.out_acc],
                  writes=[dev.fm_tok.rows(st.fdst), dev.fm_len.rows(st.fdst)])
        ops.append("stash")
        if self.backup:
            ops += self._backup(st, meta)
        return ops

    def _tree_verify(self, st: "_Step", meta, kv_s, table_r) -> List[str]:
        """Tree drafts (docs/design.md §4.12): verify the tree under its mask, accept the
        longest matching path, move the path's KV to contiguous positions."""
        dev, rt, b, k = self.dev, self.dev.rt, len(st.batch.entries), self.k
        topk = dev.cfg.topk
        rt.launch(dev.fwd, K.tree_verify, self.model, dev.target_kv.t, dev.table.t, meta.t,
                  dev.drafts.t, dev.lens.t, dev.tgt.t, k, topk, b, name="verify",
                  reads=[kv_s, table_r, meta, dev.drafts, dev.lens], writes=[kv_s, dev.tgt])
        rt.launch(dev.fwd, K.tree_accept, dev.drafts.t, dev.tgt.t, st.out_tok.t, st.out_acc.t,
                  dev.tree_path.t, dev.chain.t, k, topk, b, name="accept",
                  reads=[dev.drafts, dev.tgt],
                  writes=[st.out_tok, st.out_acc, dev.tree_path, dev.chain])
        rt.launch(dev.fwd, K.tree_compact, dev.target_kv.t, dev.table.t, meta.t, dev.lens.t,
                  dev.tree_path.t, st.out_acc.t, k, b, name="tree_compact",
                  reads=[kv_s, table_r, meta, dev.lens, dev.tree_path, st.out_acc],
                  writes=[kv_s])
        return ["verify", "accept", "tree_compact"]

    def _publish(self, st: "_Step") -> List[str]:
        """The verify's new lengths, copied to pinned memory for the host's next
        seq_lens_sum, and the verify-done event the host waits for."""
        dev, rt, b = self.dev, self.dev.rt, len(st.batch.entries)
        p = st.batch.bid % 2
        rt.launch(dev.fwd, K.publish_lens, dev.lens.t, st.out_acc.t, dev.new_lens.t, b,
                  name="publish_lens", reads=[dev.lens, st.out_acc], writes=[dev.new_lens])
        rt.copy(dev.lens_pin[p], dev.new_lens, dev.fwd, non_blocking=True)
        dev.verified[p].record(dev.fwd)
        self._published = (st.batch.bid, p, {e.rid: i for i, e in enumerate(st.batch.entries)})
        return ["publish_lens"]

    def _canary(self, st: "_Step", meta, prefill: bool) -> List[str]:
        """The KV canary record of this forward (before the WAR barrier's record: it
        reads the request->token table)."""
        if st.out_can is None:
            return []
        dev, rt = self.dev, self.dev.rt
        reads = [dev.target_kv.rows(st.batch.slots_read), dev.table.rows(st.rows), meta]
        if self.draft_canary is None:
            rt.launch(dev.fwd, C.canary, dev.target_kv.t, dev.table.t, meta.t, dev.lens.t,
                      st.out_can.t, self.tags, len(st.batch.entries), prefill, self.pfx,
                      name="canary",
                      reads=reads + ([] if prefill else [dev.lens]), writes=[st.out_can])
        else:   # the draft KV's rows in the same launch (``canary.canary_with_draft``)
            kv, tags, shift = self.draft_canary
            rt.launch(dev.fwd, C.canary_with_draft, dev.target_kv.t, dev.table.t, meta.t,
                      dev.lens.t, st.out_can.t, self.tags, len(st.batch.entries), prefill,
                      self.pfx, kv.t, tags, shift, name="canary",
                      reads=reads + [kv.rows(st.batch.slots_read)]
                      + ([] if prefill else [dev.lens]), writes=[st.out_can])
        ops = ["canary"]
        if not self.backup_canary or prefill:
            return ops
        rows = st.rows
        rt.launch(dev.fwd, BK.check_backup, dev.target_kv.t, dev.host_kv.t, dev.table.t,
                  dev.host_table.t, dev.backup_span.t, meta.t, st.out_can.t, self.tags,
                  len(st.batch.entries), name="check_backup",
                  reads=reads + [dev.host_kv.rows(st.batch.host_slots | {0}),
                                 dev.host_table.rows(rows), dev.backup_span.rows(rows)],
                  writes=[st.out_can])
        return ops + ["check_backup"]

    # -- result ------------------------------------------------------------------------------
    def collect(self, batch: Batch) -> Tuple[List[List[int]], List[int]]:
        """Wait for ``batch``'s copy-done event (a declared sync) and read its pinned
        results: per entry, the output tokens and the accept length."""
        dev, rt = self.dev, self.dev.rt
        p = batch.bid % 2
        if batch.inputs is None and self._published is not None \
                and self._published[0] == batch.bid:
            # its lengths are the host's own from now on (a batch with a snapshot: the
            # launches after it know from theirs, docs/design.md §4.14)
            self._published = None
        if not self.faults.on("no-copy-done-wait"):
            dev.done[p].synchronize()
            self.declared_syncs += 1
        toks = rt.host_list(dev.tok_pin[p])
        accs = rt.host_list(dev.acc_pin[p])
        b = len(batch.entries)
        return toks[:b], accs[:b]

    def canary(self, batch: Batch):
        """``batch``'s KV canary records (one list per entry), or None when the model
        has no KV tags. Call after ``collect``: the copy-done wait covers them."""
        if not self.tags:
            return None
        rows = self.dev.rt.host_list(self.dev.can_pin[batch.bid % 2])
        return rows[:len(batch.entries)]


class Inputs:
    """A batch's snapshot of what its launch reads of the requests (``SpecWorker.inputs``):
    the host's committed lengths (verify sync), the draft-round columns, the FutureMap
    slots, each entry's (seed, seeded), and the batches unprocessed when it was taken."""

    __slots__ = ("known", "rounds", "fut", "specs", "unprocessed")

    def __init__(self, known, rounds, fut, specs, unprocessed):
        self.known, self.rounds, self.fut = known, rounds, fut
        self.specs, self.unprocessed = specs, unprocessed


def _padded(rows, shape) -> torch.Tensor:
    """``rows`` (lists of ints) as the first rows of a zero tensor of ``shape``."""
    out = torch.zeros(shape, dtype=torch.int64)
    if rows:
        out[:len(rows)] = torch.tensor(rows, dtype=torch.int64)
    return out


class _Step:
    """Per-launch handles passed to the drafter. ``fsrc``/``fdst``: the FutureMap slots
    the batch resolves from / stashes into (its rows, with the row-indexed FutureMap);
    ``src``/``dst``: the meta columns naming them per entry."""

    __slots__ = ("batch", "staged", "out_tok", "out_acc", "n_tok", "rows", "out_can",
                 "fsrc", "fdst", "src", "dst")

    def __init__(self, batch, staged, out_tok, out_acc, n_tok, out_can=None, fut=None,
                 cols=(K.ROW, K.ROW)):
        self.batch, self.staged, self.n_tok = batch, staged, n_tok
        self.out_tok, self.out_acc, self.out_can = out_tok, out_acc, out_can
        self.rows = frozenset(e.row for e in batch.entries)
        if fut is None:
            fut = [(e.row, e.row) for e in batch.entries]
        self.fsrc = frozenset(s for s, _ in fut)
        self.fdst = frozenset(d for _, d in fut)
        self.src, self.dst = cols


def _staged(rows, shape):
    """``_padded`` on numpy: a staging buffer holds a few dozen values, and numpy builds
    them a few times faster than torch. Rows numpy refuses go to ``_padded``, which
    raises what it always raised, where it always did."""
    import numpy as np
    try:
        out = np.zeros(shape, dtype=np.int64)
        if rows:
            out[:len(rows)] = rows
        return out
    except Exception:  # noqa: BLE001 - _padded reports it
        return _padded(rows, shape)
