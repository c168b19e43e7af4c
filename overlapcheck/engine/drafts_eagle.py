"""EAGLE-style draft kind: one decoder layer (the model's ``head("eagle")``) fed the
target's hidden states, with its own one-layer KV.

EAGLE shifts its inputs: draft position ``p`` holds the pair (token ``t_{p+1}``,
target hidden ``f_p``), and its output there predicts ``t_{p+2}``. With committed
length ``L`` after a verify, the draft-extend writes the pairs of the accepted
positions ``lens .. L-1`` (tokens from the verify, hidden states from the target KV
the verify wrote) and runs the head at ``L-1``: that gives the next step's first draft
token and the hidden state to chain from. Both are *stashed in the FutureMap*
(``future_draft_token``, ``future_hidden``, rows indexed by request-pool row) and
resolved by the next step's first draft launch on the device: the host never sees
them. Draft steps ``j = 2..k`` chain the head's own hidden state (scratch
``draft_hidden``) at positions ``L .. L+k-2``, inside the verify's range.

Prefill: for each staged prompt token ``t_q`` the pair at ``q-1`` (its hidden state
recomputed from the target KV, so a chunk boundary needs nothing from the host), and
on the last chunk the pair (first output token or the host-known next token after a
retraction, ``f_{P-1}``) at ``P-1`` plus the stash.

Memory: the EAGLE KV uses the request's own slot indices (like a standalone draft),
so it needs no reserve beyond the engine's decode reserve and is released with the
request; it is listed in ``dev.kv_buffers`` so every change of owner covers it.
"""
from __future__ import annotations

from typing import List

import torch

from ..device.xp import of, one_source
from .faults import FaultSet
from .kernels import (LAST, N, NEXT, P_POS, P_RID, P_ROW, P_TOK, RID, ROW, SAMPLE, SEED, SEEDED,
                      START, gate_mask, round_tokens, stores, tree_cut, tree_node)


@one_source
def eagle_prefill(model, head, kv, ekv, table, ptok, meta, out_tok, fm_draft, fm_hid, n, b,
                  dst=ROW, topk=1):
    """Pairs of the staged prompt tokens; on a last chunk, the final pair and the stash
    (at the FutureMap slot in meta column ``dst``; ``topk`` > 1: the first depth's
    candidates of a tree, docs/design.md §4.12)."""
    xp = of(kv)
    model, head, p = xp.model(model), xp.model(head), ptok[:n]
    rows, q = p[:, P_ROW], p[:, P_POS]
    pos = xp.clamp(q - 1, 0)
    feats = model.target_hidden(kv, table, rows, pos + 1)
    head.write(ekv, table, rows, pos, p[:, P_TOK], feats, p[:, P_RID], keep=q >= 1)
    m = meta[:b]
    mrows, ctx, last = m[:, ROW], m[:, START] + m[:, N], m[:, LAST] == 1
    tok = xp.where(m[:, SAMPLE] == 1, out_tok[:b, 0], m[:, NEXT])
    feats = model.target_hidden(kv, table, mrows, ctx)
    head.write(ekv, table, mrows, ctx - 1, tok, feats, m[:, RID], keep=last)
    g, d1 = head.out(ekv, table, mrows, ctx - 1, m[:, SEED], m[:, SEEDED] == 1, **_k(topk))
    slots, keep = m[:, dst], stores(last, dst)
    fm_draft[slots] = xp.where(keep if topk == 1 else keep[:, None], d1, fm_draft[slots])
    fm_hid[slots] = xp.where(keep[:, None], xp.cast(g, fm_hid), fm_hid[slots])


@one_source
def eagle_resolve(model, fm_draft, fm_hid, meta, drafts, lens, hid, b, gate=None, hcol=None,
                  src=ROW):
    """Draft step 1: the first draft token and the hidden state, from the FutureMap slot
    in meta column ``src``."""
    model, m = of(meta).model(model), meta[:b]
    slots = m[:, src]
    drafts[:b, 1] = round_tokens(model, m, lens[:b], fm_draft[slots], drafts[:b, 1], gate, hcol)
    hid[:b] = fm_hid[slots]


@one_source
def eagle_step(model, head, ekv, table, meta, drafts, lens, hid, j, b, gate=None, hcol=None):
    """Draft step ``j`` (2..k): the pair (``drafts[j-1]``, chained hidden) at position
    ``lens + j - 2``, then the head's output there drafts token ``j``."""
    xp = of(ekv)
    model, head, m = xp.model(model), xp.model(head), meta[:b]
    rows, pos = m[:, ROW], lens[:b] + (j - 2)
    head.write(ekv, table, rows, pos, drafts[:b, j - 1], hid[:b], m[:, RID],
               keep=gate_mask(m, gate))
    g, d = head.out(ekv, table, rows, pos, m[:, SEED], m[:, SEEDED] == 1)
    drafts[:b, j] = round_tokens(model, m, lens[:b], d, drafts[:b, j], gate, hcol)
    hid[:b] = xp.cast(g, hid)


@one_source
def eagle_extend(model, head, kv, ekv, table, meta, lens, out_tok, out_acc, fm_draft, fm_hid,
                 width, b, by_position=False, dst=ROW, topk=1):
    """Pairs of the accepted positions from the verify's tokens and the target's hidden
    states; the head at the last one gives the next step's draft input, stashed at the
    request's FutureMap slot (meta column ``dst``; at its batch position under the fault
    ``eagle-stash-batch-position``)."""
    xp = of(kv)
    model, head, m = xp.model(model), xp.model(head), meta[:b]
    offs = xp.arange(width, kv)
    pos = lens[:b, None] + offs
    rows = xp.repeat_each(m[:, ROW], width)
    keep = (offs[None, :] < out_acc[:b, None]).reshape(-1)
    feats = model.target_hidden(kv, table, rows, pos.reshape(-1) + 1)
    rid = xp.repeat_each(m[:, RID], width)
    head.write(ekv, table, rows, pos.reshape(-1), out_tok[:b, :width].reshape(-1), feats, rid,
               keep=keep)
    last = lens[:b] + out_acc[:b] - 1
    g, d1 = head.out(ekv, table, m[:, ROW], last, m[:, SEED], m[:, SEEDED] == 1, **_k(topk))
    dest = xp.arange(b, kv) if by_position else m[:, dst]
    fm_draft[dest] = d1
    fm_hid[dest] = xp.cast(g, fm_hid)


@one_source
def eagle_extend_tagged_ahead(model, head, kv, ekv, table, meta, lens, out_tok, out_acc,
                              fm_draft, fm_hid, width, b, by_position=False, dst=ROW, topk=1):
    """``eagle_extend`` under the fault ``eagle-kv-tag-wrong``: the accepted positions'
    rows are tagged with the position of the token each holds (p + 1), not their own."""
    eagle_extend(model, head, kv, ekv, table, meta, lens, out_tok, out_acc, fm_draft, fm_hid,
                 width, b, by_position, dst, topk)
    xp, m = of(kv), meta[:b]
    offs = xp.arange(width, kv)
    pos = lens[:b, None] + offs
    keep = offs[None, :] < out_acc[:b, None]
    slots = table[m[:, ROW, None], pos][keep]       # rows broadcast over positions
    ekv[slots, head.kv_tag_columns[1]] = pos[keep] + 1


def _k(topk: int) -> dict:
    """The head's ``topk`` argument: none for a chain (its calls stay as they were)."""
    return {"topk": topk} if topk > 1 else {}


@one_source
def tree_eagle_resolve(model, fm_draft, fm_hid, meta, drafts, lens, hid, topk, b, hcol=None,
                       src=ROW):
    """Tree drafts' step 1: the first depth's candidates and the hidden state, from the
    FutureMap slot in meta column ``src``."""
    model, m = of(meta).model(model), meta[:b]
    slots = m[:, src]
    drafts[:b, 1:1 + topk] = tree_cut(model, m, lens[:b], fm_draft[slots], hcol)
    hid[:b] = fm_hid[slots]


@one_source
def tree_eagle_step(model, head, ekv, table, meta, drafts, lens, hid, j, topk, b, hcol=None):
    """Tree drafts' step ``j`` (2..k): the pair (rank-0 node at depth j-1, chained hidden)
    at ``lens + j - 2``, then the head's ``topk`` candidates at depth j."""
    xp = of(ekv)
    model, head, m = xp.model(model), xp.model(head), meta[:b]
    rows, pos = m[:, ROW], lens[:b] + (j - 2)
    head.write(ekv, table, rows, pos, drafts[:b, tree_node(j - 1, 0, topk)], hid[:b], m[:, RID])
    g, c = head.out(ekv, table, rows, pos, m[:, SEED], m[:, SEEDED] == 1, topk=topk)
    drafts[:b, tree_node(j, 0, topk):tree_node(j + 1, 0, topk)] = tree_cut(model, m, lens[:b], c,
                                                                          hcol)
    hid[:b] = xp.cast(g, hid)


class EagleDraft:
    """The EAGLE-style draft kind (``--draft eagle``)."""

    kind = "eagle"
    owns_kv = True
    kv = None   # no standalone draft KV for the prefill to fill

    def __init__(self, dev, model):
        self.dev, self.model, self.head = dev, model, model.head("eagle")
        self.faults = FaultSet(dev.cfg.faults)
        cfg, rt, rows = dev.cfg, dev.rt, dev.cfg.max_running
        self.ahead_writes = cfg.spec_steps - 1      # EAGLE KV at lens .. lens+k-2
        hw, hd = model.hidden_width, model.hidden_dtype
        self.ekv = rt.empty((cfg.pool_tokens, self.head.kv_width), self.head.kv_dtype,
                            "eagle_kv", dev.fwd)
        dev.kv_buffers.append(self.ekv)
        # the KV canary of its rows (position p holds the token at p + 1), where the head
        # tags them
        tags = getattr(self.head, "kv_tag_columns", None)
        self.canary_kv = (self.ekv, tags, 1) if tags else None
        # FutureMap rows of the next step's draft input
        self.topk = cfg.topk if cfg.tree else 1     # tree drafts: a depth's candidates
        shape = (dev.fm_slots,) if self.topk == 1 else (dev.fm_slots, self.topk)
        self.fm_draft = rt.empty(shape, torch.int64, "future_draft_token", dev.fwd)
        self.fm_hid = rt.empty((dev.fm_slots, hw), hd, "future_hidden", dev.fwd)
        dev.future_buffer(self.fm_draft, self.fm_hid)
        self.hid = rt.empty((rows, hw), hd, "draft_hidden", dev.fwd)

    def _fm(self, slots):
        return [self.fm_draft.rows(slots), self.fm_hid.rows(slots)]

    def launch_prefill(self, st, meta, b: int) -> List[str]:
        dev, rt = self.dev, self.dev.rt
        ptok, slots = st.staged[2], st.batch.slots_read
        rt.launch(dev.fwd, eagle_prefill, self.model, self.head, dev.target_kv.t, self.ekv.t,
                  dev.table.t, ptok.t, meta.t, st.out_tok.t, self.fm_draft.t, self.fm_hid.t,
                  st.n_tok, b, st.dst, self.topk, name="eagle_prefill",
                  reads=[dev.target_kv.rows(slots), self.ekv.rows(slots), dev.table.rows(st.rows),
                         ptok, meta, st.out_tok] + self._fm(st.fdst),
                  writes=[self.ekv.rows(slots)] + self._fm(st.fdst))
        return ["eagle_prefill"]

    def launch_drafts(self, st, meta, table_r, b: int, rnd) -> List[str]:
        dev, rt, pre = self.dev, self.dev.rt, rnd.prefix
        ekv_s = self.ekv.rows(st.batch.slots_read)
        if self.topk > 1:
            return self._tree_drafts(st, meta, table_r, b, rnd, ekv_s)
        rt.launch(dev.fwd, eagle_resolve, self.model, self.fm_draft.t, self.fm_hid.t, meta.t,
                  rnd.drafts.t, rnd.lens.t, self.hid.t, b, rnd.gate, rnd.hcol, rnd.fcol,
                  name=f"{pre}draft1", reads=self._fm(rnd.fslots) + [meta, rnd.drafts, rnd.lens],
                  writes=[rnd.drafts, self.hid])
        names = [f"{pre}draft1"]
        for j in range(2, dev.cfg.spec_steps + 1):
            rt.launch(dev.fwd, eagle_step, self.model, self.head, self.ekv.t, dev.table.t,
                      meta.t, rnd.drafts.t, rnd.lens.t, self.hid.t, j, b, rnd.gate, rnd.hcol,
                      name=f"{pre}draft{j}",
                      reads=[ekv_s, table_r, meta, rnd.drafts, rnd.lens, self.hid],
                      writes=[ekv_s, rnd.drafts, self.hid])
            names.append(f"{pre}draft{j}")
        return names

    def _tree_drafts(self, st, meta, table_r, b, rnd, ekv_s) -> List[str]:
        """Tree drafts (docs/design.md §4.12): the first depth resolved from the
        FutureMap, then k-1 head steps along the rank-0 path."""
        dev, rt, pre, topk = self.dev, self.dev.rt, rnd.prefix, self.topk
        rt.launch(dev.fwd, tree_eagle_resolve, self.model, self.fm_draft.t, self.fm_hid.t,
                  meta.t, rnd.drafts.t, rnd.lens.t, self.hid.t, topk, b, rnd.hcol, rnd.fcol,
                  name=f"{pre}draft1", reads=self._fm(rnd.fslots) + [meta, rnd.drafts, rnd.lens],
                  writes=[rnd.drafts, self.hid])
        names = [f"{pre}draft1"]
        for j in range(2, dev.cfg.spec_steps + 1):
            rt.launch(dev.fwd, tree_eagle_step, self.model, self.head, self.ekv.t, dev.table.t,
                      meta.t, rnd.drafts.t, rnd.lens.t, self.hid.t, j, topk, b, rnd.hcol,
                      name=f"{pre}draft{j}",
                      reads=[ekv_s, table_r, meta, rnd.drafts, rnd.lens, self.hid],
                      writes=[ekv_s, rnd.drafts, self.hid])
            names.append(f"{pre}draft{j}")
        return names

    def launch_extend(self, st, meta, table_r, b: int) -> List[str]:
        dev, rt = self.dev, self.dev.rt
        slots = st.batch.slots_read
        ekv_s = self.ekv.rows(slots)
        # fault: the stash is indexed like the verify outputs (batch position), not by
        # request-pool row: the next step resolves another request's draft input
        by_pos = self.faults.on("eagle-stash-batch-position")
        dest = range(b) if by_pos else st.fdst
        # fault: the rows' position tags are those of the tokens they hold (p + 1)
        extend = (eagle_extend_tagged_ahead if self.faults.on("eagle-kv-tag-wrong")
                  and self.canary_kv is not None else eagle_extend)
        rt.launch(dev.fwd, extend, self.model, self.head, dev.target_kv.t, self.ekv.t,
                  dev.table.t, meta.t, dev.lens.t, st.out_tok.t, st.out_acc.t, self.fm_draft.t,
                  self.fm_hid.t, dev.cfg.spec_steps + 1, b, by_pos, st.dst, self.topk,
                  name="draft_extend",
                  reads=[dev.target_kv.rows(slots), ekv_s, table_r, meta, dev.lens, st.out_tok,
                         st.out_acc],
                  writes=[ekv_s] + self._fm(dest))
        return ["draft_extend"]

