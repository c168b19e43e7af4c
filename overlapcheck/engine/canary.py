"""The KV canary kernel: a small record of what a forward read, for the kv-canary checker.

A model whose KV rows carry a (token, position, request) tag (``model.kv_tag_columns``,
the oracle's do) lets the forward stream check, per batch entry, every KV slot it reads
for positions ``0..n-1`` (``n``: the committed length it resolved, or the prefill's
context) against the tag the reader expects. The record travels with the batch's
result: it is copied into a pinned buffer by the copy stream before the copy-done
event, and read by the host when it processes the result, so it adds no sync. Its
columns are the protocol's (``overlapcheck/protocol/canary.py``).
"""
from __future__ import annotations

from ..device.xp import of, one_source
from ..protocol.canary import (C_BAD, C_DIGEST, C_KPOS, C_LEN, C_POS, C_RID, C_SLOT, C_TOK,
                               DK_DIGEST, DK_LEN, DK_SHIFT)
from ..protocol.digest import DIGEST_M, weight
from .kernels import N, RID, ROW, START


def tag_columns(model):
    """The (token, position, request) columns of ``model``'s KV rows, or None."""
    return getattr(model, "kv_tag_columns", None)


@one_source
def canary(kv, table, meta, lens, out, tags, b, prefill, pfx=None):
    """Forward stream: fill ``out[:b]`` with the canary record of each entry. ``pfx``:
    the meta column of each entry's shared prefix length (prefix cache), whose slots
    hold KV another request wrote: there the position and the token digest are checked,
    not the writer."""
    tok_c, pos_c, rid_c = tags
    xp, m = of(kv), meta[:b]
    n = (m[:, START] + m[:, N]) if prefill else lens[:b]
    pos = xp.arange(table.shape[1], kv)
    mask = pos[None, :] < n[:, None]
    raw = table[m[:, ROW]]
    valid = (raw >= 0) & (raw < kv.shape[0])
    slots = xp.where(mask & valid, raw, 0)             # masked cells read the padding slot
    rows = kv[slots]                                   # [b, width, kv_width]
    foreign = rows[..., rid_c] != m[:, RID, None]
    if pfx is not None:
        foreign = foreign & (pos[None, :] >= m[:, pfx, None])
    bad = mask & (~valid | (rows[..., pos_c] != pos) | foreign)
    anybad = bad.any(1)
    first, entry = xp.where(anybad, xp.long(bad).argmax(1), 0), xp.arange(b, kv)
    at = rows[entry, first]                            # [b, kv_width]
    terms = (rows[..., tok_c] % DIGEST_M) * weight(pos) % DIGEST_M
    out[:b, C_LEN] = n
    out[:b, C_BAD] = bad.sum(1)
    out[:b, C_SLOT] = xp.where(anybad, raw[entry, first], -1)
    out[:b, C_POS] = xp.where(anybad, first, -1)
    out[:b, C_TOK] = at[:, tok_c]
    out[:b, C_KPOS] = at[:, pos_c]
    out[:b, C_RID] = at[:, rid_c]
    out[:b, C_DIGEST] = xp.where(mask, terms, 0).sum(1) % DIGEST_M


@one_source
def draft_canary(kv, table, meta, lens, out, tags, b, prefill, pfx, shift):
    """Forward stream: the ``DK_*`` columns of ``out[:b]``, the canary of a draft KV
    ``kv`` whose tag columns are ``tags`` and whose row at position p holds the token at
    p + ``shift``: the rows of positions ``0..n-1`` the draft kept, ``n`` the committed
    length for a decode (the rows before it were written by earlier draft-extends or the
    prefill), the context less ``shift`` for a prefill chunk (an EAGLE pair needs the
    token after it)."""
    m = meta[:b]
    n = of(meta).clamp(m[:, START] + m[:, N] - shift, 0) if prefill else lens[:b]
    canary(kv, table, meta, n, out[:, DK_LEN:DK_DIGEST + 1], tags, b, False, pfx)
    out[:b, DK_SHIFT] = shift


@one_source
def canary_with_draft(kv, table, meta, lens, out, tags, b, prefill, pfx, dkv, dtags, shift):
    """``canary`` of the target KV, then ``draft_canary`` of the draft KV ``dkv``: one
    launch, as the canary was before the draft KV had one (the same device work in the
    same order, so a schedule recorded then replays)."""
    canary(kv, table, meta, lens, out, tags, b, prefill, pfx)
    draft_canary(dkv, table, meta, lens, out, dtags, b, prefill, pfx, shift)
