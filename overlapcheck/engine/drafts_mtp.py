"""Frozen-KV MTP draft kind: the draft (the model's ``head("mtp")``) attends to the
*target's* KV slots of its request and has no KV of its own.

Draft step ``j`` (1..k) takes the token at position ``lens + j - 1`` and a hidden
state (step 1: the target's hidden at ``lens - 1``, resolved from the FutureMap row
``future_hidden``; later steps: the previous step's output, scratch ``draft_hidden``)
and attends to the target KV of the committed positions ``0..lens-1``, which no
launch of this step writes before the verify: the draft reads them frozen. After the
verify, the *seed* launch stashes the target's hidden state at the new last committed
position into ``future_hidden`` for the next step (the prefill's last chunk does the
same).

Memory rule, made explicit (the engine's own, nothing draft-specific):

* no draft KV buffer: nothing is allocated, written or freed for the draft;
* the decode reserve is the engine's (``EngineConfig.draft_reserve``); its slots hold
  the *target's* KV of the verified tokens, so the ledger labels them ``verify``
  (``owns_kv`` False: ``Scheduler.decode_purpose``) instead of ``draft``;
* rejected positions stay between committed and allocated, are overwritten by the
  next verify and are released with the request (never freed per step): the
  verify-side free that races the tear-down in the frozen-KV MTP seed has no
  counterpart here.
"""
from __future__ import annotations

from typing import List

from ..device.xp import of, one_source
from .faults import FaultSet
from .kernels import LAST, N, ROW, SEED, SEEDED, START, round_tokens, stores


@one_source
def mtp_prefill_seed(model, kv, table, meta, fm_hid, b, dst=ROW):
    """Last prefill chunk: stash the target's hidden state at ``P - 1`` (FutureMap slot in
    meta column ``dst``)."""
    xp = of(kv)
    model, m = xp.model(model), meta[:b]
    rows, last = m[:, ROW], m[:, LAST] == 1
    h = xp.cast(model.target_hidden(kv, table, rows, m[:, START] + m[:, N]), fm_hid)
    slots, keep = m[:, dst], stores(last, dst)
    fm_hid[slots] = xp.where(keep[:, None], h, fm_hid[slots])


@one_source
def mtp_step(model, head, kv, table, meta, drafts, lens, fm_hid, hid, j, b, frozen=0,
             gate=None, hcol=None, src=ROW):
    """Draft step ``j``: token ``drafts[j-1]`` at ``lens + j - 1`` -> draft token ``j``,
    attending to the target KV of positions ``0..lens-1+frozen`` (``frozen`` is 0 but
    under the fault ``mtp-draft-reads-unfrozen-kv``); step 1 starts from the hidden state
    at the FutureMap slot in meta column ``src``."""
    xp = of(kv)
    model, head, m = xp.model(model), xp.model(head), meta[:b]
    rows = m[:, ROW]
    feats = fm_hid[m[:, src]] if j == 1 else hid[:b]
    g, d = head.step(kv, table, rows, lens[:b] + frozen, lens[:b] + (j - 1), drafts[:b, j - 1],
                     feats, m[:, SEED], m[:, SEEDED] == 1)
    drafts[:b, j] = round_tokens(model, m, lens[:b], d, drafts[:b, j], gate, hcol)
    hid[:b] = xp.cast(g, hid)


@one_source
def mtp_seed(model, kv, table, meta, lens, out_acc, fm_hid, b, dst=ROW):
    """After the verify: the target's hidden state at the new last committed position
    (FutureMap slot in meta column ``dst``)."""
    xp, rows = of(kv), meta[:b, ROW]
    fm_hid[meta[:b, dst]] = xp.cast(xp.model(model).target_hidden(kv, table, rows,
                                                                  lens[:b] + out_acc[:b]), fm_hid)


class MTPDraft:
    """The frozen-KV MTP draft kind (``--draft mtp``)."""

    kind = "mtp"
    owns_kv = False
    kv = None   # no draft KV at all
    # nothing of its own for the KV canary: its drafts read the target KV's committed
    # rows, which the target's canary covers
    canary_kv = None

    def __init__(self, dev, model):
        self.dev, self.model, self.head = dev, model, model.head("mtp")
        self.faults = FaultSet(dev.cfg.faults)
        self.ahead_writes = 0      # no draft KV: a pre-drafted round needs no reserve
        rt, rows = dev.rt, dev.cfg.max_running
        hw, hd = model.hidden_width, model.hidden_dtype
        self.fm_hid = rt.empty((dev.fm_slots, hw), hd, "future_hidden", dev.fwd)
        dev.future_buffer(self.fm_hid)
        self.hid = rt.empty((rows, hw), hd, "draft_hidden", dev.fwd)

    def launch_prefill(self, st, meta, b: int) -> List[str]:
        dev, rt = self.dev, self.dev.rt
        fm = self.fm_hid.rows(st.fdst)
        rt.launch(dev.fwd, mtp_prefill_seed, self.model, dev.target_kv.t, dev.table.t, meta.t,
                  self.fm_hid.t, b, st.dst, name="mtp_seed",
                  reads=[dev.target_kv.rows(st.batch.slots_read), dev.table.rows(st.rows), meta,
                         fm], writes=[fm])
        return ["mtp_seed"]

    def launch_drafts(self, st, meta, table_r, b: int, rnd) -> List[str]:
        dev, rt = self.dev, self.dev.rt
        kv_s = dev.target_kv.rows(st.batch.slots_read)
        names = []
        unfrozen = self.faults.on("mtp-draft-reads-unfrozen-kv")
        for j in range(1, dev.cfg.spec_steps + 1):
            src = self.fm_hid.rows(rnd.fslots) if j == 1 else self.hid
            # fault: step j also attends to the j-1 positions it is drafting, whose slots
            # hold a rejected draft's KV (the verify below overwrites it) or a recycled
            # owner's
            frozen = j - 1 if unfrozen else 0
            rt.launch(dev.fwd, mtp_step, self.model, self.head, dev.target_kv.t, dev.table.t,
                      meta.t, rnd.drafts.t, rnd.lens.t, self.fm_hid.t, self.hid.t, j, b, frozen,
                      rnd.gate, rnd.hcol, rnd.fcol, name=f"{rnd.prefix}draft{j}",
                      reads=[kv_s, table_r, meta, rnd.drafts, rnd.lens, src],
                      writes=[rnd.drafts, self.hid])
            names.append(f"{rnd.prefix}draft{j}")
        return names

    def launch_extend(self, st, meta, table_r, b: int) -> List[str]:
        dev, rt = self.dev, self.dev.rt
        fm = self.fm_hid.rows(st.fdst)
        rt.launch(dev.fwd, mtp_seed, self.model, dev.target_kv.t, dev.table.t, meta.t,
                  dev.lens.t, st.out_acc.t, self.fm_hid.t, b, st.dst, name="mtp_seed",
                  reads=[dev.target_kv.rows(st.batch.slots_read), table_r, meta, dev.lens,
                         st.out_acc], writes=[fm])
        return ["mtp_seed"]
