"""Oracle versions of the EAGLE-style head and the frozen-KV MTP draft.

The oracle's hidden state at position ``p`` is the raw context hash ``f_p`` over the
tokens ``0..p`` (``OracleModel.raw_hash``); the target's token after it is
``sample(mix(f_p, p + 1))``. Extending a hidden state by one token is exact
(``(f + term(token, position)) % M``), so a head that is fed the right hidden state
and the right token reproduces the target's token, and one fed a stale or foreign
hidden state does not. Each head keeps the target's token with a tunable
probability (``agreement`` percent), decided by a hash of what it *reads*:

* EAGLE: its own KV (one layer: ``[token, position, request, feature]`` per draft
  position, ``p`` holding the pair (``t_{p+1}``, ``f_p``), as EAGLE shifts them);
* MTP: the target's KV slots of the request, positions ``0..lens-1`` (frozen; it
  has no KV of its own).

So a corrupted, stale or recycled slot in what a head reads changes its drafts (and
accept lengths, never the committed tokens).
"""
from __future__ import annotations

import torch

from .kv_store import kept_sources, store
from .oracle_rule import HEAD_SALT, KV_WIDTH, POS, RANK_SALT, RID, TOK, M, agreed, mix, ranked, term

FEAT = KV_WIDTH   # the EAGLE KV's feature column


class _Head:
    """An oracle draft head of ``model``."""

    _host_class = ""     # its class on numpy arrays, in ``oracle_host``

    def __init__(self, model):
        self.model = model

    @property
    def host(self):
        """This head on numpy arrays, for the kernels' host runs (``device/xp.py``)."""
        h = self.__dict__.get("_host")
        if h is None:
            from . import oracle_host
            h = self._host = getattr(oracle_host, self._host_class)(self.model.host)
        return h


class OracleEagleHead(_Head):
    kv_width = KV_WIDTH + 1
    kv_dtype = torch.int64
    kv_tag_columns = (TOK, POS, RID)

    _host_class = "EagleHeadHost"

    def write(self, ekv, table, rows, pos, toks, feats, rids, keep=None) -> None:
        """Draft position ``pos`` from (token ``t_{pos+1}``, feature ``f_pos``)."""
        slots = table[rows, pos]
        new = torch.stack([toks, pos, rids, feats[:, 0]], 1)
        store(ekv, slots, new, None if keep is None else kept_sources(ekv.shape[0], slots, keep))

    def out(self, ekv, table, rows, pos, seeds, seeded, topk: int = 1):
        """Head output at draft position ``pos``: the next hidden state (``f_{pos+1}``)
        and the draft token for position ``pos + 2`` (``topk`` > 1: its ``topk`` best
        candidates, [q, topk])."""
        m = self.model
        row = ekv[table[rows, pos]]
        g = (row[:, FEAT] + term(row[:, TOK], pos + 1)) % M
        like = m.sample(mix(g, pos + 2), seeds, pos + 2, seeded)
        seen = _hash_columns(ekv, table, rows, pos + 1, (TOK, FEAT))
        return g.unsqueeze(1), _agree(m, like, mix(seen, g, seeds, pos + 2), topk)


class OracleMTPHead(_Head):
    _host_class = "MTPHeadHost"

    def step(self, kv, table, rows, lens, pos, toks, feats, seeds, seeded):
        """Token ``toks`` at position ``pos`` with hidden ``feats`` (``f_{pos-1}``):
        the next hidden state and the draft token for ``pos + 1``. Reads the target KV
        of positions ``0..lens-1``."""
        m = self.model
        g = (feats[:, 0] + term(toks, pos)) % M
        like = m.sample(mix(g, pos + 1), seeds, pos + 1, seeded)
        seen = _hash_columns(kv, table, rows, lens, (TOK,))
        return g.unsqueeze(1), _agree(m, like, mix(seen, g, seeds, pos + 1))


def _hash_columns(kv, table, rows, ctx, cols) -> torch.Tensor:
    """Hash of columns ``cols`` of the KV slots of positions ``0..ctx-1``."""
    width = table.shape[1]
    pos = torch.arange(width, device=table.device)
    mask = pos.unsqueeze(0) < ctx.unsqueeze(1)
    vals = kv[torch.where(mask, table[rows], 0)]
    h = torch.zeros(rows.shape[0], dtype=torch.int64, device=kv.device)
    for c in cols:
        h = h + torch.where(mask, term(vals[..., c], pos + c), 0).sum(1)
    return h % M


def _agree(m, like, u, topk: int = 1) -> torch.Tensor:
    """The head's draft (``m``: its ``OracleModel``): ``like`` where ``u``'s agreement
    hash says so (``topk`` > 1: the ranked candidates)."""
    salt = m.salt + HEAD_SALT
    if topk > 1:
        agrees = [mix(u, salt + RANK_SALT * r) % 100 < m.agreement for r in range(topk)]
        return torch.stack(ranked(like, 1 + mix(u, 3) % (m.vocab - 1), agrees, m.vocab,
                                  torch.where), 1)
    return agreed(like, mix(u, salt), u, m.vocab, m.agreement, torch.where)


def make_oracle_head(kind: str, model):
    if kind == "eagle":
        return OracleEagleHead(model)
    if kind == "mtp":
        return OracleMTPHead(model)
    raise ValueError(f"unknown head {kind!r} (eagle or mtp)")
