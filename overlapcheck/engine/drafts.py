"""Draft kinds. Each drafter owns its draft-side buffers and enqueues the draft steps
and the draft-extend of one decode batch; the worker does the rest. ``standalone``
is a separate draft model with its own KV; EAGLE-style heads and frozen-KV MTP plug
in here with the same two methods.
"""
from __future__ import annotations

from typing import List

import torch

from . import kernels as K


class StandaloneDraft:
    """A standalone draft model with its own KV (same slot indices as the target)."""

    def __init__(self, dev, model):
        self.dev, self.model = dev, model
        cfg = dev.cfg
        self.kv = dev.rt.empty((cfg.pool_tokens, model.kv_width), torch.int64, "draft_kv",
                               dev.fwd)
        dev.kv_buffers.append(self.kv)

    def launch_drafts(self, st, meta, table_r, b: int) -> List[str]:
        """k chained draft steps: each writes the previous token's draft KV and drafts one."""
        dev, rt = self.dev, self.dev.rt
        kv_s = self.kv.rows(st.batch.slots_read)
        names = []
        for j in range(1, dev.cfg.spec_steps + 1):
            rt.launch(dev.fwd, K.draft_step, self.model, self.kv.t, dev.table.t, meta.t,
                      dev.drafts.t, dev.lens.t, j, b, name=f"draft{j}",
                      reads=[kv_s, table_r, meta, dev.drafts, dev.lens],
                      writes=[kv_s, dev.drafts])
            names.append(f"draft{j}")
        return names

    def launch_extend(self, st, meta, table_r, b: int) -> List[str]:
        """Draft-extend: the draft KV of the accepted inputs, up to the new committed length."""
        dev, rt = self.dev, self.dev.rt
        kv_s = self.kv.rows(st.batch.slots_read)
        rt.launch(dev.fwd, K.draft_extend, self.model, self.kv.t, dev.table.t, meta.t,
                  dev.drafts.t, dev.lens.t, st.out_acc.t, dev.cfg.spec_steps + 1, b,
                  name="draft_extend",
                  reads=[kv_s, table_r, meta, dev.drafts, dev.lens, st.out_acc],
                  writes=[kv_s])
        return ["draft_extend"]


DRAFTERS = {"standalone": StandaloneDraft}


def make_drafter(kind: str, dev, model):
    try:
        return DRAFTERS[kind](dev, model)
    except KeyError:
        raise ValueError(f"unknown draft kind {kind!r} (choose from {', '.join(DRAFTERS)})") from None
