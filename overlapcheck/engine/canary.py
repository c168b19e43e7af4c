"""The KV canary: a small record of what a forward read, for the kv-canary checker.

A model whose KV rows carry a (token, position, request) tag (``model.kv_tag_columns``,
the oracle's do) lets the forward stream check, per batch entry, every KV slot it reads
for positions ``0..n-1`` (``n``: the committed length it resolved, or the prefill's
context) against the tag the reader expects. The record travels with the batch's
result: it is copied into a pinned buffer by the copy stream before the copy-done
event, and read by the host when it processes the result, so it adds no sync.

Record columns per entry (``CANARY`` wide): read length, mismatching slots, the first
mismatch's slot and position, the (token, position, request) found there, and the
``events.token_digest`` of every token read.
"""
from __future__ import annotations

import torch

from .events import DIGEST_M
from .kernels import N, RID, ROW, START

C_LEN, C_BAD, C_SLOT, C_POS, C_TOK, C_KPOS, C_RID, C_DIGEST = range(8)
# with the KV backup, a decode's check of the host pool (``backup_check``): the span
# backed up, differing positions, the first one and the tag the host pool held there
BK_START, BK_END, BK_BAD, BK_POS, BK_TOK, BK_KPOS, BK_RID = range(8, 15)
CANARY = 15


def backup_fields(rec) -> tuple:
    """The ``Canary.backup`` fields of a decode record that checked the KV backup."""
    return tuple(rec[BK_START:CANARY])


def canary_fields(rec, backup: bool) -> tuple:
    """The ``Canary`` fields after (iteration, batch, rid) of a record; ``backup``: the
    record carries the KV backup's check."""
    n, bad, slot, pos, tok, kpos, rid, digest = rec[:C_DIGEST + 1]
    return (n, bad, slot, pos, (tok, kpos, rid), digest, backup_fields(rec) if backup else ())


def tag_columns(model):
    """The (token, position, request) columns of ``model``'s KV rows, or None."""
    return getattr(model, "kv_tag_columns", None)


def canary(kv, table, meta, lens, out, tags, b, prefill, pfx=None):
    """Forward stream: fill ``out[:b]`` with the canary record of each entry. ``pfx``:
    the meta column of each entry's shared prefix length (prefix cache), whose slots
    hold KV another request wrote: there the position and the token digest are checked,
    not the writer."""
    tok_c, pos_c, rid_c = tags
    m = meta[:b]
    n = (m[:, START] + m[:, N]) if prefill else lens[:b]
    pos = torch.arange(table.shape[1], device=kv.device)
    mask = pos.unsqueeze(0) < n.unsqueeze(1)
    raw = table[m[:, ROW]]
    valid = (raw >= 0) & (raw < kv.shape[0])
    slots = torch.where(mask & valid, raw, 0)          # masked cells read the padding slot
    rows = kv[slots]                                   # [b, width, kv_width]
    foreign = rows[..., rid_c] != m[:, RID, None]
    if pfx is not None:
        foreign = foreign & (pos.unsqueeze(0) >= m[:, pfx, None])
    bad = mask & (~valid | (rows[..., pos_c] != pos) | foreign)
    anybad = bad.any(1)
    first = torch.where(anybad, bad.long().argmax(1), 0).unsqueeze(1)
    at = rows.gather(1, first.unsqueeze(2).expand(b, 1, rows.shape[2])).squeeze(1)
    weights = (pos * 40503 + 17) % DIGEST_M + 1
    terms = (rows[..., tok_c] % DIGEST_M) * weights % DIGEST_M
    out[:b, C_LEN] = n
    out[:b, C_BAD] = bad.sum(1)
    out[:b, C_SLOT] = torch.where(anybad, raw.gather(1, first).squeeze(1), -1)
    out[:b, C_POS] = torch.where(anybad, first.squeeze(1), -1)
    out[:b, C_TOK] = at[:, tok_c]
    out[:b, C_KPOS] = at[:, pos_c]
    out[:b, C_RID] = at[:, rid_c]
    out[:b, C_DIGEST] = torch.where(mask, terms, 0).sum(1) % DIGEST_M
