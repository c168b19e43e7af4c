"""The KV backup's content check: the host pool read back on the device, its verdict
carried in the KV canary record (docs/design.md §4.7; checker kv-backup).

Per request-pool row, ``span[row] = (start, end)``: the positions the backup stream has
copied into the host pool since the row's owner was (re)prefilled.

* the last prefill chunk sets it to ``(P, P)`` (``P``: the context it ends; decodes
  start there), on the forward stream;
* after each ``backup_kv`` the backup stream extends ``end`` by the positions the verify
  accepted, when they continue the span (a skipped backup leaves a gap that stays);
* the next forward of the row (which already waits for the pending backup) compares,
  for every position of the span, the host-pool row with the target KV row it copied,
  and writes the span, the count of differing positions, the first one and the tag the
  host pool held there into the entry's canary record (``BK_*`` columns), which goes
  to the host with the batch's result: no new sync.

On with ``kv_backup``, ``EngineConfig.backup_canary`` (the default) and a model whose
KV rows carry tags (the canary record exists only then). The comparison reads only
positions below the committed length (whose target KV no
launch of this forward rewrites before the check) and the host pool, which only the
backup stream writes, after this forward.
"""
from __future__ import annotations

import torch

from ..device.xp import of, one_source
from ..protocol.canary import BK_BAD, BK_END, BK_KPOS, BK_POS, BK_RID, BK_START, BK_TOK
from .kernels import LAST, N, ROW, START

SPAN = 2


def allocate_spans(dev) -> None:
    """``dev.backup_span``: one (start, end) per request-pool row, a row buffer (its
    changes of owner follow the row's)."""
    dev.backup_span = dev.rt.empty((dev.cfg.max_running, SPAN), torch.int64, "backup_span",
                                   dev.fwd)
    dev.row_buffers.append(dev.backup_span)


@one_source
def reset_span(span, meta, b):
    """Forward stream, prefill: a row whose prefill ends here starts an empty span at the
    context it ends."""
    xp, m = of(meta), meta[:b]
    rows, last = m[:, ROW], (m[:, LAST] == 1)[:, None]
    ctx = xp.expand((m[:, START] + m[:, N])[:, None], (b, SPAN))
    span[rows] = xp.where(last, ctx, span[rows])


@one_source
def note_backup(span, meta, lens, out_acc, b):
    """Backup stream, after ``backup_kv``: the verify's accepted positions join the span
    when they continue it."""
    rows = meta[:b, ROW]
    end = span[rows, 1]
    span[rows, 1] = of(meta).where(end == lens[:b], lens[:b] + out_acc[:b], end)


@one_source
def check_backup(kv, host_kv, table, host_table, span, meta, out, tags, b):
    """Forward stream, decode: compare the host pool with the target KV over each row's
    span; fill the ``BK_*`` columns of ``out`` (the canary record)."""
    tok_c, pos_c, rid_c = tags
    xp, rows = of(kv), meta[:b, ROW]
    s, e = span[rows, 0], span[rows, 1]
    pos = xp.arange(table.shape[1], kv)
    mask = (pos[None, :] >= s[:, None]) & (pos[None, :] < e[:, None])
    src, dst = table[rows], host_table[rows]
    valid = (src >= 0) & (src < kv.shape[0]) & (dst >= 0) & (dst < host_kv.shape[0])
    src = xp.where(mask & valid, src, 0)             # masked cells read the padding slot
    dst = xp.where(mask & valid, dst, 0)
    held = host_kv[dst]
    bad = mask & (~valid | (held != kv[src]).any(-1))
    anybad = bad.any(1)
    first = xp.where(anybad, xp.long(bad).argmax(1), 0)
    at = held[xp.arange(b, kv), first]               # [b, kv_width]
    out[:b, BK_START] = s
    out[:b, BK_END] = e
    out[:b, BK_BAD] = bad.sum(1)
    out[:b, BK_POS] = xp.where(anybad, first, -1)
    out[:b, BK_TOK] = xp.long(at[:, tok_c])
    out[:b, BK_KPOS] = xp.long(at[:, pos_c])
    out[:b, BK_RID] = xp.long(at[:, rid_c])
