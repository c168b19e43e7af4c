"""The oracle pair and its heads on numpy arrays: the host mirror of ``oracle``,
``oracle_heads`` and ``kv_store``, value for value.

On the simulated device, buffers are CPU tensors and a kernel's tensors are a few dozen
integers, so the cost of a kernel is the number of ops it issues: about 2.6 µs each
through torch, several times less through numpy. The sim runs an engine kernel's one
source on numpy views of its tensors when nothing intercepts its ops (declared accesses,
or no detector; docs/design.md §3.4, "One source per kernel"), and the kernel calls
this module through ``OracleModel.host`` and the heads' ``host``. Every function here
computes exactly what its torch original computes, including integer wrap-around on
poison values and the last-writer-wins of duplicate indices; where numpy would accept
an index torch rejects (a negative index of ``gather``/``scatter``), it raises instead,
so that the sim reruns the kernel on torch, which reports the failure where it happens.
A checked run (``twins: check``) holds every call made through it to the torch model's.
"""
from __future__ import annotations

import numpy as np

from .oracle_rule import (HEAD_SALT, KV_WIDTH, POS, RANK_SALT, RID, SEEDED_PERCENT,
                          STANDALONE_SALT, TOK, M, ranked, weight)

FEAT = KV_WIDTH
assert (TOK, POS, RID) == (0, 1, 2)    # a KV row is (token, position, request)
_MIX = {}   # y -> (y % M) * 69621 + 12345 for the constant salts


_I64 = np.dtype(np.int64)
_SMALL = 12   # up to this many values, mix runs on Python ints (numpy's per-op cost dominates)


def _mix_small(x, ys):
    """``mix`` of a short 1-d ``x`` with values in [0, M) on Python ints: every
    intermediate stays below 2**50, where int64 and Python ints agree, and ``%`` is
    the floor modulo in both. None when an operand does not fit that case."""
    xs = x.tolist()
    if not xs or min(xs) < 0 or max(xs) >= M:
        return None
    cols = []
    for y in ys:
        if isinstance(y, int):
            c = _MIX.get(y)
            if c is None:
                c = _MIX[y] = (y % M) * 69621 + 12345
            cols.append(c)
        elif type(y) is np.ndarray and y.dtype is _I64 and y.shape == x.shape:
            cols.append(y.tolist())
        else:
            return None
    for c in cols:
        if type(c) is int:
            xs = [(t := (v * 48271 + c) % M) ^ (t >> 11) for v in xs]
        else:
            xs = [(t := (v * 48271 + (w % M) * 69621 + 12345) % M) ^ (t >> 11)
                  for v, w in zip(xs, c)]
    return np.array(xs, dtype=np.int64)


def mix(x, *ys):
    """``oracle_rule.mix`` on int64 arrays (``ys``: arrays or ints). A short one on Python
    ints; else in place on its own temporaries: a kernel's arrays hold a few dozen
    values, so the cost is the ops."""
    if x.dtype is _I64 and x.ndim == 1 and x.shape[0] <= _SMALL:
        out = _mix_small(x, ys)
        if out is not None:
            return out
    for y in ys:
        if isinstance(y, int):
            c = _MIX.get(y)
            if c is None:
                c = _MIX[y] = (y % M) * 69621 + 12345
            x = x * 48271
            x += c
        else:
            t = y % M
            t *= 69621
            x = x * 48271
            x += t
            x += 12345
        x %= M
        x ^= x >> 11
    return x


def term(tokens, positions):
    return ((tokens % M) * weight(positions)) % M


_sum = np.add.reduce    # x.sum(axis) without ndarray.sum's Python wrapper
_FACTORS = {}   # (width, shift) -> (positions 0..width-1, their factor at position + shift)


def _factors(width: int, shift: int = 0):
    """``pos = arange(width)`` and ``weight(pos + shift)``, the position half of
    ``term``, the same for every call on a table of that width."""
    hit = _FACTORS.get((width, shift))
    if hit is None:
        pos = np.arange(width)
        hit = _FACTORS[(width, shift)] = (pos, weight(pos + shift))
    return hit


def _terms(tokens, factor, mask=None):
    """``where(mask, term(tokens, positions), 0)`` with ``factor`` from ``_factors``
    (``mask`` None: every position)."""
    t = tokens % M
    t *= factor
    t %= M
    if mask is not None:
        t *= mask
    return t


def kept_sources(n_slots: int, slots, keep):
    """``kv_store.kept_sources``, comparing the entries with each other (a kernel's
    few dozen) instead of scattering into a scratch row per slot of the buffer."""
    n = slots.shape[0]
    if n and (slots.min() < 0 or slots.max() >= n_slots):
        raise IndexError("slot out of range (torch's scatter refuses it)")
    idx = np.arange(n)
    if not n:
        return idx
    cand = np.where(keep, idx, -1)
    last = np.where(slots[:, None] == slots, cand, -1).max(1)
    return np.where(keep, idx, last)


def store(dst, slots, new, src=None) -> None:
    if src is not None:
        new = np.where((src >= 0)[:, None], new[np.maximum(src, 0)], dst[slots])
    dst[slots] = new


def _single(kv, rows, ctx) -> bool:
    """Whether a hash is of a single query (the common case: one request). Its hash
    reads the slots of its first ``ctx`` positions only: the masked positions past
    ``ctx`` add 0 and read slot 0 (there is one), so these are all the slots the hash
    reads, with the same index checks (a slot or row out of range raises), on a few
    times fewer numpy ops."""
    return rows.shape == (1,) and ctx.shape == (1,) and kv.shape[0] > 0


_SHORT = 32    # up to this many positions, a one-query hash sums its terms on Python ints


# Hashes already computed, by the exact values they read: within a step several kernels
# hash the same table rows (a verify's targets, then the draft's context), and a parity
# reference run hashes the contexts its checked run will hash again; in a campaign about
# three calls in four find theirs here (docs/design.md §3.4). A hash is a function of the
# values it reads (and of the table width bounding them), so a hit returns what the
# call would compute. Emptied when full.
_MEMO: dict = {}
_MEMO_CAP = 512


def _remember(key, value):
    if len(_MEMO) >= _MEMO_CAP:
        _MEMO.clear()
    _MEMO[key] = value
    return value


def raw_hash_one(kv, table, row: int, ctx: int) -> int:
    """``raw_hash`` of one query (``row``, ``ctx``: ints) as an int: the terms of its
    first ``ctx`` slots (see ``_single``; a pool that is not empty), after one gather
    (which wraps or refuses a slot as the array path does); a short context's on Python
    ints (each term is below M: the sum is the int64 one); remembered by the tokens it
    read (``_MEMO``)."""
    width = table.shape[1]
    c = min(max(ctx, 0), width)
    toks = kv[table[row, :c], TOK]
    key = (0, toks.dtype.str, toks.tobytes())
    hit = _MEMO.get(key)
    if hit is not None:
        return hit
    if c <= _SHORT and toks.dtype is _I64:
        f = _factor_list(width, 0)
        return _remember(key, sum([t % M * f[p] % M for p, t in enumerate(toks.tolist())]) % M)
    return _remember(key, int(_sum(_terms(toks, _factors(width)[1][:c]))) % M)


def raw_hash(kv, table, rows, ctx_lens):
    if _single(kv, rows, ctx_lens):
        return np.array([raw_hash_one(kv, table, int(rows[0]), int(ctx_lens[0]))],
                        dtype=np.int64)
    pos, factor = _factors(table.shape[1])
    mask = pos < ctx_lens[:, None]
    slots = np.where(mask, table[rows], 0)
    return _sum(_terms(kv[:, TOK][slots], factor, mask), 1) % M


def hash_columns(kv, table, rows, ctx, cols):
    """``oracle_heads._hash_columns``."""
    width = table.shape[1]
    if _single(kv, rows, ctx):
        c = min(max(int(ctx[0]), 0), width)
        vals = kv[table[rows[0], :c]]
        h = 0
        for col in cols:
            h += int(_sum(_terms(vals[:, col], _factors(width, col)[1][:c])))
        return np.array([h % M], dtype=np.int64)
    pos = _factors(width)[0]
    mask = pos < ctx[:, None]
    vals = kv[np.where(mask, table[rows], 0)]
    h = np.zeros(rows.shape[0], dtype=np.int64)
    for c in cols:
        h += _sum(_terms(vals[..., c], _factors(width, c)[1], mask), 1)
    return h % M


_FLISTS = {}    # (width, shift) -> ``_factors(width, shift)``'s factors as Python ints


def _factor_list(width: int, shift: int) -> list:
    hit = _FLISTS.get((width, shift))
    if hit is None:
        hit = _FLISTS[(width, shift)] = _factors(width, shift)[1].tolist()
    return hit


def _rows(*cols):
    """``np.stack(cols, axis=-1)`` of equal-shaped 1-d int64 columns (torch.stack
    refuses unequal ones: so does this)."""
    n = cols[0].shape
    for c in cols:
        if c.shape != n or c.ndim != 1:
            raise ValueError("stack expects each tensor to be equal size")
    out = np.empty((n[0], len(cols)), dtype=np.result_type(*cols))
    for i, c in enumerate(cols):
        out[:, i] = c
    return out


_TINY = 16     # up to this many queries, a head's or sample's chain runs on Python ints
_C1, _C3 = (1 % M) * 69621 + 12345, (3 % M) * 69621 + 12345   # mix(x, 1), mix(x, 3)


def _tiny(n, *arrays) -> bool:
    """Whether the per-query chains may run on Python ints: at most ``_TINY`` queries and
    every operand a 1-d int64 (or bool) array of ``n`` values (the kernels' case; any
    other shape takes the array path, which broadcasts or refuses as torch does). Every
    ``x`` a chain mixes is below 2**31 (a hash ``% M`` or a mix of one), where int64
    and Python ints agree; the ``y``s enter as ``y % M``, the floor modulo in both."""
    if n > _TINY:
        return False
    for a in arrays:
        if a.shape != (n,) or not (a.dtype is _I64 or a.dtype == np.bool_):
            return False
    return True


def _stack(cols):
    """``torch.stack(cols, 1)`` of equal-shaped 1-d columns."""
    return np.stack(cols, 1)


class OracleHost:
    """``OracleModel``'s methods on numpy arrays (see the module docstring)."""

    kv_width = KV_WIDTH          # the target's and a standalone draft's KV row
    eagle_width = KV_WIDTH + 1   # the EAGLE head's
    def __init__(self, model):
        self.vocab, self.agreement, self.salt = model.vocab, model.agreement, model.salt

    def write_kv(self, kv, table, rows, pos, toks, rids, keep=None) -> None:
        slots = table[rows, pos]
        if keep is None and kv.shape[1] == KV_WIDTH and pos.ndim == 1 and \
                toks.shape == pos.shape == rids.shape:
            # column by column: the same last-writer-wins rows as storing stacked rows
            kv[slots, TOK] = toks
            kv[slots, POS] = pos
            kv[slots, RID] = rids
            return
        new = _rows(toks, pos, rids)
        store(kv, slots, new, None if keep is None else kept_sources(kv.shape[0], slots, keep))

    write_draft_kv = write_kv

    def context_hash(self, kv, table, rows, ctx_lens):
        return mix(raw_hash(kv, table, rows, ctx_lens), ctx_lens)

    def target_hidden(self, kv, table, rows, ctx_lens):
        return raw_hash(kv, table, rows, ctx_lens)[:, None]

    def sample(self, h, seeds, positions, seeded):
        return self._sample(h, seeds, positions, seeded)[0]

    def _sample(self, h, seeds, positions, seeded, need_u=False):
        """``sample``'s token, and ``u = mix(h, seeds, positions)`` when it was needed
        (``need_u``, or any ``seeded``; else None)."""
        greedy = mix(h, 1) % self.vocab
        if not need_u and not np.count_nonzero(seeded):
            return greedy, None       # np.where(False..., other, greedy) is greedy
        u = mix(h, seeds, positions)
        other = (u >> 7) % self.vocab
        return np.where(seeded & (u % 100 < SEEDED_PERCENT), other, greedy), u

    def target(self, kv, table, rows, ctx_lens, seeds, seeded):
        raw = raw_hash(kv, table, rows, ctx_lens)
        if _tiny(raw.shape[0], ctx_lens, seeds, seeded):
            return np.array(self.targets(raw.tolist(), ctx_lens.tolist(), seeds.tolist(),
                                          seeded.tolist()), dtype=np.int64)
        return self.sample(mix(raw, ctx_lens), seeds, ctx_lens, seeded)

    def target_one(self, kv, table, row: int, ctx: int, seed: int, seeded: bool) -> int:
        """``target`` of one query on ints (``ctx``, ``seed``: int64 values, as the
        query's arrays hold them; a pool that is not empty)."""
        return self.targets([raw_hash_one(kv, table, row, ctx)], [ctx], [seed], [seeded])[0]

    def targets(self, raws, cs, ss, sds) -> list:
        """``sample(mix(raw, c), s, c, sd)`` per query, on Python ints."""
        V, out = self.vocab, []
        for r, c, s, sd in zip(raws, cs, ss, sds):
            cm = (c % M) * 69621 + 12345
            t = (r * 48271 + cm) % M
            h = t ^ (t >> 11)
            t = (h * 48271 + _C1) % M
            tok = (t ^ (t >> 11)) % V
            if sd:
                t = (h * 48271 + (s % M) * 69621 + 12345) % M
                u = t ^ (t >> 11)
                t = (u * 48271 + cm) % M
                u = t ^ (t >> 11)
                if u % 100 < SEEDED_PERCENT:
                    tok = (u >> 7) % V
            out.append(tok)
        return out

    def drafts(self, raws, cs, ss, sds) -> list:
        """``draft``'s chain tokens per query, on Python ints (see ``draft``)."""
        V, A, out = self.vocab, self.agreement, []
        ca = _MIX.get(self.salt + STANDALONE_SALT)
        if ca is None:
            y = self.salt + STANDALONE_SALT
            ca = _MIX[y] = (y % M) * 69621 + 12345
        for r, c, s, sd in zip(raws, cs, ss, sds):
            cm = (c % M) * 69621 + 12345
            t = (r * 48271 + cm) % M
            h = t ^ (t >> 11)
            t = (h * 48271 + _C1) % M
            like = (t ^ (t >> 11)) % V
            t = (h * 48271 + (s % M) * 69621 + 12345) % M
            u = t ^ (t >> 11)
            t = (u * 48271 + cm) % M
            u = t ^ (t >> 11)
            if sd and u % 100 < SEEDED_PERCENT:
                like = (u >> 7) % V
            t = (u * 48271 + ca) % M
            if (t ^ (t >> 11)) % 100 >= A:
                t = (h * 48271 + _C3) % M
                like = (like + 1 + (t ^ (t >> 11)) % (V - 1)) % V
            out.append(like)
        return out

    def _head_tokens(self, g, seen, p, seeds, seeded):
        """A chain head's draft tokens: ``_agree(sample(mix(g, p), seeds, p, seeded),
        mix(seen, g, seeds, p))``, per query on Python ints where ``_tiny``."""
        if not _tiny(g.shape[0], g, seen, p, seeds, seeded):
            like = self.sample(mix(g, p), seeds, p, seeded)
            return self._agree(like, mix(seen, g, seeds, p))
        return np.array(self.heads(g.tolist(), seen.tolist(), p.tolist(), seeds.tolist(),
                                   seeded.tolist()), dtype=np.int64)

    def _head_chain(self, x: int, e: int, q: int, s: int, sd: bool):
        """One query's head chain on Python ints (``x``: g, ``e``: seen, both in [0, M);
        ``q``: p): the sampled token ``like = sample(mix(g, p), s, p, sd)`` and
        ``u = mix(seen, g, s, p)``, which ``heads`` and ``tree_head`` agree on."""
        V = self.vocab
        pm = (q % M) * 69621 + 12345
        sm = (s % M) * 69621 + 12345
        t = (x * 48271 + pm) % M
        h = t ^ (t >> 11)
        t = (h * 48271 + _C1) % M
        like = (t ^ (t >> 11)) % V
        if sd:
            t = (h * 48271 + sm) % M
            u = t ^ (t >> 11)
            t = (u * 48271 + pm) % M
            u = t ^ (t >> 11)
            if u % 100 < SEEDED_PERCENT:
                like = (u >> 7) % V
        t = (e * 48271 + (x % M) * 69621 + 12345) % M
        u = t ^ (t >> 11)
        t = (u * 48271 + sm) % M
        u = t ^ (t >> 11)
        t = (u * 48271 + pm) % M
        return like, t ^ (t >> 11)

    def heads(self, gs, seens, ps, ss, sds) -> list:
        """``_head_tokens`` per query on Python ints (every ``g``, ``seen`` in [0, M))."""
        V, A, out = self.vocab, self.agreement, []
        ca = _MIX.get(self.salt + HEAD_SALT)
        if ca is None:
            y = self.salt + HEAD_SALT
            ca = _MIX[y] = (y % M) * 69621 + 12345
        for x, e, q, s, sd in zip(gs, seens, ps, ss, sds):
            like, u = self._head_chain(x, e, q, s, sd)
            t = (u * 48271 + ca) % M
            if (t ^ (t >> 11)) % 100 >= A:
                t = (u * 48271 + _C3) % M
                like = (like + 1 + (t ^ (t >> 11)) % (V - 1)) % V
            out.append(like)
        return out

    def draft(self, draft_kv, table, rows, ctx_lens, seeds, seeded, topk: int = 1):
        if topk == 1:
            raw = raw_hash(draft_kv, table, rows, ctx_lens)
            if _tiny(raw.shape[0], ctx_lens, seeds, seeded):
                return np.array(self.drafts(raw.tolist(), ctx_lens.tolist(), seeds.tolist(),
                                             seeded.tolist()), dtype=np.int64)
            h = mix(raw, ctx_lens)
        else:
            h = self.context_hash(draft_kv, table, rows, ctx_lens)
        like, u = self._sample(h, seeds, ctx_lens, seeded, need_u=True)
        salt = self.salt + STANDALONE_SALT
        agree = mix(u, salt) % 100 < self.agreement   # mix(h, seeds, ctx_lens, salt)
        if topk > 1:
            agrees = [agree] + [mix(u, salt + RANK_SALT * r) % 100 < self.agreement
                                for r in range(1, topk)]
            return _stack(ranked(like, 1 + mix(h, 3) % (self.vocab - 1), agrees, self.vocab,
                                 np.where))
        other = (like + 1 + mix(h, 3) % (self.vocab - 1)) % self.vocab
        return np.where(agree, like, other)

    def host_lens_cut(self, drafts, lens, host_lens):
        cut = np.maximum(lens - host_lens, 0)
        other = (drafts + 1 + mix(drafts % M, cut, 5) % (self.vocab - 1)) % self.vocab
        return np.where(cut > 0, other, drafts)

    def _agree(self, like, u, topk: int = 1):
        if topk > 1:
            agrees = [mix(u, self.salt + HEAD_SALT + RANK_SALT * r) % 100 < self.agreement
                      for r in range(topk)]
            return _stack(ranked(like, 1 + mix(u, 3) % (self.vocab - 1), agrees, self.vocab,
                                 np.where))
        other = (like + 1 + mix(u, 3) % (self.vocab - 1)) % self.vocab
        return np.where(mix(u, self.salt + HEAD_SALT) % 100 < self.agreement, like, other)

    # -- heads (oracle_heads) ---------------------------------------------------------------
    def eagle_write(self, ekv, table, rows, pos, toks, feats, rids, keep=None) -> None:
        slots = table[rows, pos]
        new = _rows(toks, pos, rids, feats[:, 0])
        store(ekv, slots, new, None if keep is None else kept_sources(ekv.shape[0], slots, keep))

    def eagle_out(self, ekv, table, rows, pos, seeds, seeded, topk: int = 1):
        row = ekv[table[rows, pos]]
        g = (row[:, FEAT] + term(row[:, TOK], pos + 1)) % M
        seen = hash_columns(ekv, table, rows, pos + 1, (TOK, FEAT))
        if topk == 1:
            return g[:, None], self._head_tokens(g, seen, pos + 2, seeds, seeded)
        like = self.sample(mix(g, pos + 2), seeds, pos + 2, seeded)
        return g[:, None], self._agree(like, mix(seen, g, seeds, pos + 2), topk)

    def mtp_step(self, kv, table, rows, lens, pos, toks, feats, seeds, seeded):
        g = (feats[:, 0] + term(toks, pos)) % M
        seen = hash_columns(kv, table, rows, lens, (TOK,))
        return g[:, None], self._head_tokens(g, seen, pos + 1, seeds, seeded)


class EagleHeadHost:
    """The oracle EAGLE head on numpy arrays (``OracleEagleHead.host``): its calls go to
    the model's host mirror."""

    def __init__(self, host: OracleHost):
        self.write, self.out = host.eagle_write, host.eagle_out


class MTPHeadHost:
    """The oracle MTP head on numpy arrays (``OracleMTPHead.host``)."""

    def __init__(self, host: OracleHost):
        self.step = host.mtp_step


__all__ = ["OracleHost", "EagleHeadHost", "MTPHeadHost", "mix", "term", "raw_hash", "kept_sources", "store", "ranked", "POS",
           "RID"]
