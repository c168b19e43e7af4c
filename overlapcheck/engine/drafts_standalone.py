"""The standalone draft kind: a separate draft model with its own KV, filled by the
prefill next to the target's (same slot indices as the target)."""
from __future__ import annotations

from typing import List

import torch

from . import kernels as K


class StandaloneDraft:
    """A standalone draft model with its own KV (same slot indices as the target)."""

    kind = "standalone"
    owns_kv = True

    def __init__(self, dev, model):
        self.dev, self.model = dev, model
        cfg = dev.cfg
        self.ahead_writes = cfg.spec_steps          # draft KV at lens .. lens+k-1
        self.kv = dev.rt.empty((cfg.pool_tokens, getattr(model, "draft_kv_width", model.kv_width)),
                               getattr(model, "kv_dtype", torch.int64), "draft_kv", dev.fwd)
        dev.kv_buffers.append(self.kv)
        # the KV canary of its rows, where the draft model tags them as the target does
        tags = getattr(model, "draft_kv_tag_columns", getattr(model, "kv_tag_columns", None))
        self.canary_kv = (self.kv, tags, 0) if tags else None

    def launch_prefill(self, st, meta, b: int) -> List[str]:
        """Nothing beyond the prefill's own write of the draft KV (``self.kv``)."""
        return []

    def launch_drafts(self, st, meta, table_r, b: int, rnd) -> List[str]:
        """k chained draft steps of round ``rnd``: each writes the previous token's draft
        KV and drafts one."""
        dev, rt = self.dev, self.dev.rt
        kv_s = self.kv.rows(st.batch.slots_read)
        names = []
        if dev.cfg.tree:
            return self._tree_drafts(st, meta, table_r, b, rnd, kv_s)
        for j in range(1, dev.cfg.spec_steps + 1):
            rt.launch(dev.fwd, K.draft_step, self.model, self.kv.t, dev.table.t, meta.t,
                      rnd.drafts.t, rnd.lens.t, j, b, rnd.gate, rnd.hcol,
                      name=f"{rnd.prefix}draft{j}",
                      reads=[kv_s, table_r, meta, rnd.drafts, rnd.lens],
                      writes=[kv_s, rnd.drafts])
            names.append(f"{rnd.prefix}draft{j}")
        return names

    def _tree_drafts(self, st, meta, table_r, b, rnd, kv_s) -> List[str]:
        """Tree drafts (docs/design.md §4.12): k steps along the rank-0 path, each
        drafting ``topk`` candidates of the next depth."""
        dev, rt, cfg = self.dev, self.dev.rt, self.dev.cfg
        names = []
        for j in range(1, cfg.spec_steps + 1):
            rt.launch(dev.fwd, K.tree_draft_step, self.model, self.kv.t, dev.table.t, meta.t,
                      rnd.drafts.t, rnd.lens.t, j, cfg.topk, b, rnd.hcol,
                      name=f"{rnd.prefix}draft{j}",
                      reads=[kv_s, table_r, meta, rnd.drafts, rnd.lens],
                      writes=[kv_s, rnd.drafts])
            names.append(f"{rnd.prefix}draft{j}")
        return names

    def launch_extend(self, st, meta, table_r, b: int) -> List[str]:
        """Draft-extend: the draft KV of the accepted inputs, up to the new committed
        length (with tree drafts, the accepted path's tokens: ``dev.chain``)."""
        dev, rt = self.dev, self.dev.rt
        kv_s = self.kv.rows(st.batch.slots_read)
        inputs = dev.chain if dev.cfg.tree else dev.drafts
        rt.launch(dev.fwd, K.draft_extend, self.model, self.kv.t, dev.table.t, meta.t,
                  inputs.t, dev.lens.t, st.out_acc.t, dev.cfg.spec_steps + 1, b,
                  name="draft_extend",
                  reads=[kv_s, table_r, meta, inputs, dev.lens, st.out_acc],
                  writes=[kv_s])
        return ["draft_extend"]
