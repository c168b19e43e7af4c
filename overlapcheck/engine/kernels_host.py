"""Host twins of the device closures: the same kernels on numpy arrays, for the sim.

A sim kernel works on a few dozen integers, so its cost is the number of ops it
issues (about 2.6 µs each through torch, several times less through numpy). Each
function here computes exactly what the kernel of the same name computes (in
``kernels``, ``canary``, ``backup_check``, ``drafts_eagle``, ``drafts_mtp``), taking
the same arguments with every tensor as a numpy view of the same memory; model calls
go to the model's own twin (``model.host``: the oracle family,
``fake_models/oracle_host.py``).

``host_twin(kernel)`` registers a twin on its kernel; the runtime runs it only where it
may (docs/design.md §3.4): a backend whose work is CPU tensors (``rt.cpu_work``) and no
interception (declared accesses, or no detector), so access inference, CUDA and models
without a twin run the torch kernel. A twin that cannot run (``NoHostTwin``: the model
has none) leaves the work to the torch kernel. A twin that fails (an index out of
range, as a stale read gives) refuses before it writes, as torch does; the kernel then
runs on the same inputs, and where it does not fail as well the two disagree, which is
a finding (``device/twins.py``). A fixed share of the fuzzer's examples runs every twin
launch against its kernel (``Case.twins``); tests/test_host_closures.py compares the
two on every draft kind, model variant and engine mode.
"""
from __future__ import annotations

import numpy as np

from ..device.twins import NoTwin
from ..protocol import canary as R
from ..protocol.digest import DIGEST_M, weight
from . import backup_check as BK
from . import canary as C
from . import drafts_eagle as DE
from . import drafts_mtp as DM
from . import kernels as K
from .kernels import (AHEAD, LAST, LSUM, N, NEXT, NOW, P_POS, P_RID, P_ROW, P_TOK, RID, ROW,
                      SAMPLE, SEED, SEEDED, START)


class NoHostTwin(NoTwin):
    """The kernel's model has no host twin: run the torch kernel."""


def host_twin(kernel):
    """Register the decorated function as ``kernel``'s host twin."""
    def register(fn):
        kernel.host_twin = fn
        return fn
    return register


_sum = np.add.reduce          # x.sum(axis) without ndarray.sum's Python wrapper
_any = np.logical_or.reduce   # x.any(axis), likewise


_FEW = 8     # up to this many prompt tokens, prefill_write runs on Python ints
_SANE = 2 ** 40    # values below this in size: no int64 wrap in the few sums they enter
_FEW_B = 4     # up to this many entries, the model kernels below run on Python ints
_FEW_TOKENS = 16   # and up to this many prompt tokens
_I64 = np.dtype(np.int64)


def _ints(b, *arrays) -> bool:
    """Whether every array is int64 with at least ``b`` rows (the Python-int paths'
    case; any other takes the array path, which casts or refuses as torch does)."""
    for a in arrays:
        if a.dtype is not _I64 or a.shape[0] < b:
            return False
    return True


def _model(model):
    hm = getattr(model, "host", None)
    if hm is None:
        raise NoHostTwin(type(model).__name__)
    return hm


def _gather_last(out_tok, acc, b):
    """``out_tok[:b].gather(1, (acc - 1).unsqueeze(1)).squeeze(1)``."""
    idx = acc - 1
    il = idx.tolist()      # a batch's few values: Python's min/max beat ndarray's wrappers
    if il and (min(il) < 0 or max(il) >= out_tok.shape[1]):
        raise IndexError("gather index out of range (torch refuses it)")
    return out_tok[np.arange(b), idx]


def _flat(x, b, width):
    """``x.unsqueeze(1).expand(b, width).reshape(-1)``."""
    return x.repeat(width)


def _stores(last, dst):
    """``kernels.stores``."""
    return last if dst == ROW else np.ones_like(last)


def _round_tokens(hm, m, lens, new, old, gate, hcol):
    if hcol is not None:
        new = hm.host_lens_cut(new, lens, m[:, hcol])
    return new if gate is None else np.where(m[:, gate] == 1, new, old)


# -- kernels.py ----------------------------------------------------------------------------
def _write_table_few(table, cells, n) -> bool:
    """``write_table`` of a few cells (most batches) on Python ints: their places
    checked first, as numpy's scatter does, then stored; False, having written nothing,
    where a place is out of the table (the array path wraps or refuses it as torch
    does) or the arrays are not int64 ones."""
    if not (cells.dtype is _I64 and cells.ndim == 2 and cells.shape[1] == 3
            and table.dtype is _I64 and table.ndim == 2 and table.shape[1]):
        return False
    w, rows, cs = table.shape[1], table.shape[0], cells[:n].tolist()
    for r, p, _ in cs:
        if not (-_SANE < r < _SANE and -_SANE < p < _SANE and 0 <= r + p // w < rows):
            return False
    for r, p, v in cs:
        table[r + p // w, p % w] = v      # the last writer of a cell wins
    return True


@host_twin(K.write_table)
def write_table(table, cells, n):
    if n <= _FEW and _write_table_few(table, cells, n):
        return
    c = cells[:n]
    w = table.shape[1]
    table[c[:, 0] + c[:, 1] // w, c[:, 1] % w] = c[:, 2]


assert (P_ROW, P_POS, P_TOK, P_RID) == (0, 1, 2, 3)   # a staged token's columns


@host_twin(K.prefill_write)
def prefill_write(model, kv, draft_kv, table, ptok, n):
    hm = _model(model)
    if n <= _FEW and ptok.dtype == np.int64:
        # a few tokens (most chunks): each one's slot looked up as the gather does (an
        # index out of range raises before any write), then stored on Python ints (the
        # oracle writes its draft KV as its target KV)
        toks = ptok[:n].tolist()
        slots = [int(table[r, q]) for r, q, _, _ in toks]
        if hm.write_kv_tokens(kv, slots, toks) and (
                draft_kv is None or hm.write_kv_tokens(draft_kv, slots, toks)):
            return
    p = ptok[:n]
    args = (table, p[:, P_ROW], p[:, P_POS], p[:, P_TOK], p[:, P_RID])
    hm.write_kv(kv, *args)
    if draft_kv is not None:
        hm.write_draft_kv(draft_kv, *args)


@host_twin(K.prefill_finish)
def prefill_finish(model, kv, table, fm_tok, fm_len, meta, out_tok, out_acc, b, dst=ROW):
    hm = _model(model)
    if b == 1 and meta.dtype == np.int64 and kv.shape[0]:
        e = meta[0].tolist()      # one entry (most prefills): on Python ints
        ctx = _int64(e[START] + e[N])
        tok = hm.target_one(kv, table, e[ROW], ctx, e[SEED], e[SEEDED] == 1)
        return _finish_one(fm_tok, fm_len, e, tok, ctx, out_tok, out_acc, dst)
    m = meta[:b]
    rows, ctx = m[:, ROW], m[:, START] + m[:, N]
    t = hm.target(kv, table, rows, ctx, m[:, SEED], m[:, SEEDED] == 1)
    sample, last = m[:, SAMPLE] == 1, m[:, LAST] == 1
    out_tok[:b, 0] = np.where(sample, t, -1)
    out_acc[:b] = sample
    nxt = np.where(sample | ~last, t, m[:, NEXT])
    slots, keep = m[:, dst], _stores(last, dst)
    fm_tok[slots] = np.where(keep, nxt, fm_tok[slots])
    fm_len[slots] = np.where(keep, ctx, fm_len[slots])


def _int64(x: int) -> int:
    """``x`` wrapped to int64, as the sum of two int64 arrays wraps."""
    return (x + 2 ** 63) % 2 ** 64 - 2 ** 63


def _finish_one(fm_tok, fm_len, e, tok, ctx, out_tok, out_acc, dst):
    """``prefill_finish`` after the target, for a batch of one entry (``e``: its meta
    row, ``tok``: its target, ``ctx``: its context length): the same writes, in the same
    order, on Python ints instead of a dozen one-value numpy ops."""
    sample, last = e[SAMPLE] == 1, e[LAST] == 1
    out_tok[0, 0] = tok if sample else -1
    out_acc[0] = sample
    nxt = tok if sample or not last else e[NEXT]
    slot, keep = e[dst], last or dst != ROW      # ``_stores``
    fm_tok[slot] = nxt if keep else fm_tok[slot]
    fm_len[slot] = ctx if keep else fm_len[slot]


@host_twin(K.resolve)
def resolve(fm_tok, fm_len, meta, drafts, lens, b, src=ROW):
    slots = meta[:b, src]
    drafts[:b, 0] = fm_tok[slots]
    lens[:b] = fm_len[slots]


@host_twin(K.seq_lens_sum)
def seq_lens_sum(meta, lens, out, b, from_host):
    out[0] = meta[0, LSUM] if from_host else _sum(lens[:b])


@host_twin(K.publish_lens)
def publish_lens(lens, out_acc, new_lens, b):
    new_lens[:b] = lens[:b] + out_acc[:b]


def _backup_kv_few(kv, host_kv, table, host_table, meta, lens, out_acc, width, b) -> bool:
    """``backup_kv`` of a few entries on Python ints: the (source, destination) pairs in
    the kernel's order, a position past an entry's accept length repeating the first
    pair, every index checked before the first write."""
    if not (_ints(b, meta, lens, out_acc) and _ints(0, kv, host_kv, table, host_table)
            and kv.ndim == host_kv.ndim == 2 and kv.shape[1] == host_kv.shape[1]
            and table.shape[1] == host_table.shape[1] and width >= 1 and b >= 1):
        return False
    ms, ls, accs = meta[:b].tolist(), lens[:b].tolist(), out_acc[:b].tolist()
    n_rows, w_t = min(table.shape[0], host_table.shape[0]), table.shape[1]
    pairs = []
    for e, L, a in zip(ms, ls, accs):
        r = e[ROW]
        if not (0 <= r < n_rows and 0 <= L and L + width <= w_t):
            return False
        src, dst = table[r, L:L + width].tolist(), host_table[r, L:L + width].tolist()
        pairs += [(s, d, o < a) for o, (s, d) in enumerate(zip(src, dst))]
    s0, d0 = pairs[0][0], pairs[0][1]
    pairs = [(s, d) if kept else (s0, d0) for s, d, kept in pairs]
    ks, hs = kv.shape[0], host_kv.shape[0]
    for s, d in pairs:
        if not (0 <= s < ks and 0 <= d < hs):
            return False
    vals = kv[[s for s, _ in pairs]].tolist()
    for (_, d), v in zip(pairs, vals):
        host_kv[d] = v                      # the last writer of a slot wins
    return True


@host_twin(K.backup_kv)
def backup_kv(kv, host_kv, table, host_table, meta, lens, out_acc, width, b):
    if b <= _FEW_B and _backup_kv_few(kv, host_kv, table, host_table, meta, lens, out_acc,
                                      width, b):
        return
    m = meta[:b]
    offs = np.arange(width)
    pos = (lens[:b, None] + offs).reshape(-1)
    rows = _flat(m[:, ROW], b, width)
    keep = (offs < out_acc[:b, None]).reshape(-1)
    src, dst = table[rows, pos], host_table[rows, pos]
    dst = np.where(keep, dst, dst[0])
    src = np.where(keep, src, src[0])
    host_kv[dst] = kv[src]


def _draft_step_few(hm, draft_kv, table, meta, drafts, lens, j, b, gate) -> bool:
    """``draft_step`` (a standalone chain draft) of a few entries on Python ints (no
    host-lengths cut); False, having written nothing, where the array path must run."""
    if draft_kv.shape[1] != hm.kv_width:
        return False
    ms, ls = meta[:b].tolist(), lens[:b].tolist()
    size, width_t, plan = draft_kv.shape[0], table.shape[1], []
    for e, L in zip(ms, ls):
        at = L + j - 1
        slots = hm.row_slots(table, e[ROW], at + 1, size) if at >= 0 else None
        if slots is None:
            return False
        plan.append(slots)
    toks = drafts[:b, j - 1].tolist()
    for slots, e, L, t in zip(plan, ms, ls, toks):
        if gate is None or e[gate] == 1:        # kept: the last kept writer of a slot wins
            draft_kv[slots[L + j - 1]] = (t, L + j - 1, e[RID])
    raws = [hm.row_hashes(draft_kv[slots], width_t)[-1] for slots in plan]
    new = hm.drafts(raws, [L + j for L in ls], [e[SEED] for e in ms],
                    [e[SEEDED] == 1 for e in ms])
    old = drafts[:b, j].tolist()
    drafts[:b, j] = [d if gate is None or e[gate] == 1 else o for d, e, o in zip(new, ms, old)]
    return True


@host_twin(K.draft_step)
def draft_step(model, draft_kv, table, meta, drafts, lens, j, b, gate=None, hcol=None):
    hm = _model(model)
    if b <= _FEW_B and hcol is None and _ints(b, meta, lens, drafts) \
            and _ints(0, draft_kv, table) and hasattr(hm, "drafts") and drafts.shape[1] > j >= 1 \
            and _draft_step_few(hm, draft_kv, table, meta, drafts, lens, j, b, gate):
        return
    m = meta[:b]
    rows, pos = m[:, ROW], lens[:b] + (j - 1)
    hm.write_draft_kv(draft_kv, table, rows, pos, drafts[:b, j - 1], m[:, RID],
                      keep=None if gate is None else m[:, gate] == 1)
    d = hm.draft(draft_kv, table, rows, pos + 1, m[:, SEED], m[:, SEEDED] == 1)
    drafts[:b, j] = _round_tokens(hm, m, lens[:b], d, drafts[:b, j], gate, hcol)


def _fm_entries(fm_drafts, meta, drafts, k, b, col):
    """A few-entry restore's or stash's meta rows and FutureMap slots (meta column
    ``col``), or None where its path does not apply (an unusual shape or dtype, a slot
    out of range: the array path then runs, or the kernel)."""
    if not (_ints(b, meta, drafts) and fm_drafts.dtype is _I64 and fm_drafts.ndim == 2
            and fm_drafts.shape[1] == k and drafts.shape[1] > k >= 0):
        return None
    ms = meta[:b].tolist()
    slots = [e[col] for e in ms]
    return (ms, slots) if _rows_in(slots, fm_drafts.shape[0]) else None


def _restore_few(fm_drafts, meta, drafts, k, b, src) -> bool:
    got = _fm_entries(fm_drafts, meta, drafts, k, b, src)
    if got is None:
        return False
    ms, slots = got
    pre = fm_drafts[slots]                   # read before any write, as the kernel's gather
    for i, e in enumerate(ms):
        if e[NOW] == 0:
            drafts[i, 1:k + 1] = pre[i]
    return True


@host_twin(K.restore)
def restore(fm_drafts, meta, drafts, k, b, src=ROW):
    if b <= _FEW_B and _restore_few(fm_drafts, meta, drafts, k, b, src):
        return
    m = meta[:b]
    pre = (m[:, NOW] == 0)[:, None]
    drafts[:b, 1:k + 1] = np.where(pre, fm_drafts[m[:, src]], drafts[:b, 1:k + 1])


def _ahead_start_few(meta, lens, out_tok, out_acc, next_drafts, next_lens, b) -> bool:
    if not (_ints(b, meta, lens, out_tok, out_acc, next_drafts, next_lens)
            and out_tok.ndim == next_drafts.ndim == 2 and next_drafts.shape[1]
            and next_lens.ndim == 1):
        return False
    accs, w = out_acc[:b].tolist(), out_tok.shape[1]
    for a in accs:
        if not 0 < a <= w:
            return False
    toks = out_tok[:b].tolist()
    next_drafts[:b, 0] = [t[a - 1] for t, a in zip(toks, accs)]
    next_lens[:b] = [_int64(L + a) if e[AHEAD] == 1 else 0
                     for e, L, a in zip(meta[:b].tolist(), lens[:b].tolist(), accs)]
    return True


@host_twin(K.ahead_start)
def ahead_start(meta, lens, out_tok, out_acc, next_drafts, next_lens, b):
    if b <= _FEW_B and _ahead_start_few(meta, lens, out_tok, out_acc, next_drafts, next_lens,
                                        b):
        return
    m, acc = meta[:b], out_acc[:b]
    first = _gather_last(out_tok, acc, b)
    next_drafts[:b, 0] = first
    next_lens[:b] = np.where(m[:, AHEAD] == 1, lens[:b] + acc, 0)


def _ahead_stash_few(fm_drafts, meta, next_drafts, k, b, dst) -> bool:
    got = _fm_entries(fm_drafts, meta, next_drafts, k, b, dst)
    if got is None:
        return False
    ms, slots = got
    old, new = fm_drafts[slots], next_drafts[:b, 1:k + 1]   # both read before any write
    for i, (s, e) in enumerate(zip(slots, ms)):
        fm_drafts[s] = new[i] if e[AHEAD] == 1 else old[i]    # the last writer wins
    return True


@host_twin(K.ahead_stash)
def ahead_stash(fm_drafts, meta, next_drafts, k, b, dst=ROW):
    if b <= _FEW_B and _ahead_stash_few(fm_drafts, meta, next_drafts, k, b, dst):
        return
    slots, ahead = meta[:b, dst], (meta[:b, AHEAD] == 1)[:, None]
    fm_drafts[slots] = np.where(ahead, next_drafts[:b, 1:k + 1], fm_drafts[slots])


def _write_targets(hm, kv, table, ms, ls, toks, width):
    """``verify``/``decode`` of a few entries on Python ints: per entry (``ms``: its
    meta row, ``ls``: its length, ``toks``: its ``width`` input tokens) the KV of
    positions ``L..L+width-1`` written, then the target after each, from running sums
    of its table row's terms (``hm.row_hashes``). Returns the target tokens per entry, or
    None, having written nothing, where the array path must run (a row, position or
    slot out of range: it reports or wraps them as torch does)."""
    size, width_t = kv.shape[0], table.shape[1]
    if kv.shape[1] != hm.kv_width:
        return None
    plan = []
    for e, L in zip(ms, ls):
        slots = hm.row_slots(table, e[ROW], L + width, size) if L >= 0 else None
        if slots is None:
            return None
        plan.append(slots)
    for slots, e, L, tk in zip(plan, ms, ls, toks):
        rid = e[RID]
        for o in range(width):
            kv[slots[L + o]] = (tk[o], L + o, rid)   # (TOK, POS, RID); the last writer wins
    out = []
    for slots, e, L in zip(plan, ms, ls):
        pre = hm.row_hashes(kv[slots], width_t)
        cs = range(L + 1, L + width + 1)
        out.append(hm.targets([pre[c] for c in cs], cs, [e[SEED]] * width,
                              [e[SEEDED] == 1] * width))
    return out


@host_twin(K.verify)
def verify(model, kv, table, meta, drafts, lens, tgt, width, b):
    hm = _model(model)
    if b <= _FEW_B and _ints(b, meta, lens, drafts, tgt) and _ints(0, kv, table) \
            and hasattr(hm, "hashes") \
            and drafts.shape[1] >= width and tgt.shape[1] >= width:
        t = _write_targets(hm, kv, table, meta[:b].tolist(), lens[:b].tolist(),
                           drafts[:b, :width].tolist(), width)
        if t is not None:
            tgt[:b, :width] = t
            return
    m = meta[:b]
    offs = np.arange(width)
    pos = (lens[:b, None] + offs).reshape(-1)
    rows = _flat(m[:, ROW], b, width)
    hm.write_kv(kv, table, rows, pos, drafts[:b, :width].reshape(-1), _flat(m[:, RID], b, width))
    t = hm.target(kv, table, rows, pos + 1, _flat(m[:, SEED], b, width),
                  _flat(m[:, SEEDED] == 1, b, width))
    tgt[:b, :width] = t.reshape(b, width)


def _accept_few(drafts, tgt, out_tok, out_acc, k, b) -> bool:
    """``accept`` of a few entries: the matching prefixes on Python ints."""
    if not (k >= 0 and drafts.shape[1] > k and tgt.shape[1] > k and out_tok.shape[1] > k
            and _ints(b, drafts, tgt, out_tok, out_acc)):
        return False
    accs = []
    for d, t in zip(drafts[:b, 1:k + 1].tolist(), tgt[:b, :k].tolist()):
        a = 1
        for x, y in zip(d, t):
            if x != y:
                break
            a += 1
        accs.append(a)
    out_acc[:b] = accs
    out_tok[:b, :k + 1] = tgt[:b, :k + 1]
    return True


@host_twin(K.accept)
def accept(drafts, tgt, out_tok, out_acc, k, b):
    if b <= _FEW_B and _accept_few(drafts, tgt, out_tok, out_acc, k, b):
        return
    match = (drafts[:b, 1:k + 1] == tgt[:b, :k]).astype(np.int64)
    out_acc[:b] = _sum(match.cumprod(1), 1) + 1
    out_tok[:b, :k + 1] = tgt[:b, :k + 1]


def _draft_extend_few(hm, draft_kv, table, meta, drafts, lens, out_acc, width, b) -> bool:
    """``draft_extend`` of a few entries on Python ints: the accepted positions' draft
    KV, every slot checked first; False, having written nothing, where the array path
    must run."""
    if draft_kv.shape[1] != hm.kv_width or drafts.shape[1] < width:
        return False
    ms, ls, accs = meta[:b].tolist(), lens[:b].tolist(), out_acc[:b].tolist()
    size, plan = draft_kv.shape[0], []
    for e, L in zip(ms, ls):
        slots = hm.row_slots(table, e[ROW], L + width, size) if L >= 0 else None
        if slots is None:
            return False
        plan.append(slots)
    for slots, e, L, a, tk in zip(plan, ms, ls, accs, drafts[:b, :width].tolist()):
        rid = e[RID]
        for o in range(min(max(a, 0), width)):     # kept: the last kept writer wins
            draft_kv[slots[L + o]] = (tk[o], L + o, rid)
    return True


@host_twin(K.draft_extend)
def draft_extend(model, draft_kv, table, meta, drafts, lens, out_acc, width, b):
    hm = _model(model)
    if b <= _FEW_B and _ints(b, meta, lens, drafts, out_acc) and _ints(0, draft_kv, table) \
            and hasattr(hm, "drafts") \
            and _draft_extend_few(hm, draft_kv, table, meta, drafts, lens, out_acc, width, b):
        return
    m = meta[:b]
    offs = np.arange(width)
    pos = (lens[:b, None] + offs).reshape(-1)
    keep = (offs < out_acc[:b, None]).reshape(-1)
    hm.write_draft_kv(draft_kv, table, _flat(m[:, ROW], b, width), pos,
                      drafts[:b, :width].reshape(-1), _flat(m[:, RID], b, width), keep=keep)


def _stash_few(fm_tok, fm_len, meta, lens, out_tok, out_acc, b, dst) -> bool:
    """``stash`` of a few entries on Python ints; False, having written nothing, where
    an accept length or FutureMap slot is out of range (the array path wraps or refuses
    them as torch does)."""
    if not (_ints(b, meta, lens, out_tok, out_acc) and _ints(0, fm_tok, fm_len)
            and out_tok.ndim == 2 and fm_tok.ndim == 1 and fm_len.ndim == 1):
        return False
    slots, accs = meta[:b, dst].tolist(), out_acc[:b].tolist()
    n, w = min(fm_tok.shape[0], fm_len.shape[0]), out_tok.shape[1]
    for s, a in zip(slots, accs):
        if not (0 <= s < n and 0 < a <= w):
            return False
    for s, a, t in zip(slots, accs, out_tok[:b].tolist()):
        fm_tok[s] = t[a - 1]
    for s, a, L in zip(slots, accs, lens[:b].tolist()):
        fm_len[s] = _int64(L + a)
    return True


@host_twin(K.stash)
def stash(fm_tok, fm_len, meta, lens, out_tok, out_acc, b, dst=ROW):
    if b <= _FEW_B and _stash_few(fm_tok, fm_len, meta, lens, out_tok, out_acc, b, dst):
        return
    slots, acc = meta[:b, dst], out_acc[:b]
    fm_tok[slots] = _gather_last(out_tok, acc, b)
    fm_len[slots] = lens[:b] + acc


@host_twin(K.decode)
def decode(model, kv, table, meta, drafts, lens, out_tok, out_acc, b):
    hm = _model(model)
    if b <= _FEW_B and _ints(b, meta, lens, drafts, out_tok, out_acc) and _ints(0, kv, table) \
            and hasattr(hm, "hashes") and drafts.shape[1] and out_tok.shape[1]:
        t = _write_targets(hm, kv, table, meta[:b].tolist(), lens[:b].tolist(),
                           drafts[:b, :1].tolist(), 1)
        if t is not None:
            out_tok[:b, 0] = [x[0] for x in t]
            out_acc[:b] = 1
            return
    m = meta[:b]
    rows, pos = m[:, ROW], lens[:b]
    hm.write_kv(kv, table, rows, pos, drafts[:b, 0], m[:, RID])
    out_tok[:b, 0] = hm.target(kv, table, rows, pos + 1, m[:, SEED], m[:, SEEDED] == 1)
    out_acc[:b] = 1


# -- tree drafts (kernels.py) ---------------------------------------------------------------
_TREES = {}     # (k, topk) -> (parent, depth, path) of kernels.tree_shape / tree_paths


def _tree(k: int, topk: int):
    """``tree_shape`` and ``tree_paths`` (the same for every call with ``k``, ``topk``)."""
    hit = _TREES.get((k, topk))
    if hit is None:
        n = 1 + k * topk
        depth = [0] + [(i - 1) // topk + 1 for i in range(1, n)]
        parent = [-1] + [0 if depth[i] <= 1 else 1 + (depth[i] - 2) * topk for i in range(1, n)]
        path = [[i] * (k + 1) for i in range(n)]
        for i in range(n):
            cur = i
            for _ in range(k + 1):
                path[i][depth[cur]] = cur
                cur = parent[cur] if parent[cur] >= 0 else cur
        hit = _TREES[(k, topk)] = (np.array(parent), np.array(depth), np.array(path))
    return hit


def _tree_cut(hm, m, lens, cands, hcol):
    """``kernels.tree_cut``."""
    if hcol is None:
        return cands
    return hm.host_lens_cut(cands, lens[:, None], m[:, hcol][:, None])


@host_twin(K.tree_draft_step)
def tree_draft_step(model, draft_kv, table, meta, drafts, lens, j, topk, b, hcol=None):
    hm = _model(model)
    m = meta[:b]
    rows, pos = m[:, ROW], lens[:b] + (j - 1)
    prev = 0 if j == 1 else K.tree_node(j - 1, 0, topk)
    hm.write_draft_kv(draft_kv, table, rows, pos, drafts[:b, prev], m[:, RID])
    c = hm.draft(draft_kv, table, rows, pos + 1, m[:, SEED], m[:, SEEDED] == 1, topk=topk)
    drafts[:b, K.tree_node(j, 0, topk):K.tree_node(j + 1, 0, topk)] = _tree_cut(
        hm, m, lens[:b], c, hcol)


_TREE_LISTS = {}     # (k, topk) -> (parent, depth) of ``_tree`` as lists


def _tree_verify_few(hm, kv, table, meta, drafts, lens, tgt, k, topk, b) -> bool:
    """``tree_verify`` of a few entries on Python ints: node ``i``'s KV written at its
    row's position ``L + i`` (its place in the tree's view), then each node's target
    from its ancestors' terms (``hm.tree_raws``); False, having written nothing, where
    the array path must run."""
    hit = _TREE_LISTS.get((k, topk))
    if hit is None:
        parent, depth, _ = _tree(k, topk)
        hit = _TREE_LISTS[(k, topk)] = (parent.tolist(), depth.tolist())
    parent, depth = hit
    n = len(parent)
    if kv.shape[1] != hm.kv_width or drafts.shape[1] < n or tgt.shape[1] < n:
        return False
    ms, ls = meta[:b].tolist(), lens[:b].tolist()
    size, width_t, plan = kv.shape[0], table.shape[1], []
    for e, L in zip(ms, ls):
        slots = hm.row_slots(table, e[ROW], L + n, size) if L >= 0 else None
        if slots is None:
            return False
        plan.append(slots)
    for slots, e, L, tk in zip(plan, ms, ls, drafts[:b, :n].tolist()):
        rid = e[RID]
        for i in range(n):                 # (TOK, POS, RID); the last writer wins
            kv[slots[L + i]] = (tk[i], L + depth[i], rid)
    out = []
    for slots, e, L in zip(plan, ms, ls):
        raws = hm.tree_raws(kv[slots].tolist(), L, width_t, parent, depth)
        out.append(hm.targets(raws, [L + d + 1 for d in depth], [e[SEED]] * n,
                              [e[SEEDED] == 1] * n))
    tgt[:b, :n] = out
    return True


@host_twin(K.tree_verify)
def tree_verify(model, kv, table, meta, drafts, lens, tgt, k, topk, b):
    hm = _model(model)
    if b <= _FEW_B and _ints(b, meta, lens, drafts, tgt) and _ints(0, kv, table) \
            and hasattr(hm, "tree_raws") \
            and _tree_verify_few(hm, kv, table, meta, drafts, lens, tgt, k, topk, b):
        return
    m = meta[:b]
    parent, depth, path = _tree(k, topk)
    n, w = parent.shape[0], table.shape[1]
    L = lens[:b, None, None]
    rel = np.arange(w)[None, None, :] - L                        # [b, 1, w]
    inpath = (rel >= 0) & (rel <= depth[None, :, None])          # [b, n, w]
    anc = path[np.arange(n)[:, None], np.clip(rel, 0, k)]         # [b, n, w]
    cols = np.where(inpath, L + anc, rel + L)
    if cols.size and (cols.min() < 0 or cols.max() >= w):
        raise IndexError("gather index out of range (torch refuses it)")
    view = table[m[:, ROW]][np.arange(b)[:, None, None], cols].reshape(b * n, w)
    q = np.arange(b * n)
    pos = (lens[:b, None] + depth[None, :]).reshape(-1)
    hm.write_kv(kv, view, q, pos, drafts[:b, :n].reshape(-1), m[:, RID].repeat(n))
    tgt[:b, :n] = hm.target(kv, view, q, pos + 1, m[:, SEED].repeat(n),
                            (m[:, SEEDED] == 1).repeat(n)).reshape(b, n)


@host_twin(K.tree_accept)
def tree_accept(drafts, tgt, out_tok, out_acc, path, chain, k, topk, b):
    parent = _tree(k, topk)[0].tolist()
    n = len(parent)
    if drafts.shape[1] < n or tgt.shape[1] < n:
        raise IndexError("tree wider than its buffers (torch refuses it)")
    toks, tgts = drafts[:b, :n].tolist(), tgt[:b, :n].tolist()
    accs, nodes = [], []
    for tok, t in zip(toks, tgts):
        cur, acc, got = 0, 1, [0] * (k + 1)
        for d in range(1, k + 1):
            if acc == d:        # alive: every depth so far had a hit
                want = t[cur]
                for i in range(n):
                    if parent[i] == cur and tok[i] == want:
                        cur = i
                        acc += 1
                        break
            got[d] = cur
        accs.append(acc)
        nodes.append(got)
    nodes = np.array(nodes, dtype=np.int64).reshape(b, k + 1)
    rows = np.arange(b)[:, None]
    out_acc[:b] = accs
    out_tok[:b, :k + 1] = tgt[:b, :n][rows, nodes]
    path[:b, :k + 1] = nodes
    chain[:b, :k + 1] = drafts[:b, :n][rows, nodes]


@host_twin(K.tree_compact)
def tree_compact(kv, table, meta, lens, path, out_acc, k, b):
    m = meta[:b]
    rows = m[:, ROW][:, None]
    d = np.arange(1, k + 1)[None, :]
    L = lens[:b, None]
    src = table[rows, L + path[:b, 1:k + 1]]
    dst = table[rows, L + d]
    keep = d < out_acc[:b, None]
    kv[dst.reshape(-1)] = kv[np.where(keep, src, dst).reshape(-1)]


# -- canary.py -----------------------------------------------------------------------------
_DIGEST = {}    # table width -> (positions, their digest factors, those as a list)


def _digest_factors(width: int):
    """``pos = arange(width)`` and ``digest.weight(pos)`` (the canary's digest weights,
    the same for every call on a table of that width), and the factors as Python ints."""
    hit = _DIGEST.get(width)
    if hit is None:
        pos = np.arange(width)
        factor = weight(pos)
        hit = _DIGEST[width] = (pos, factor, factor.tolist())
    return hit


_TAGS = (0, 1, 2)   # tag columns in the canary record's order (the oracle's)
assert (R.C_KPOS, R.C_RID) == (R.C_TOK + 1, R.C_TOK + 2)   # one slice of the record


@host_twin(C.canary)
def canary(kv, table, meta, lens, out, tags, b, prefill, pfx=None):
    tok_c, pos_c, rid_c = tags
    m = meta[:b]
    n = (m[:, START] + m[:, N]) if prefill else lens[:b]
    if b <= _FEW_B and table.shape[1] and kv.shape[0] and kv.dtype == np.int64 \
            and m.shape[0] == b and out.shape[0] >= b:
        ms, ns, rows = m.tolist(), n.tolist(), table.shape[0]
        for e in ms:            # a row out of the table: the array path reports it
            if not -rows <= e[ROW] < rows:
                break
        else:                   # entry by entry (each record reads its own row only)
            for i, (e, k) in enumerate(zip(ms, ns)):
                _canary_one(kv, table, e, k, out, tags, pfx, i)
            return
    pos, factor, _ = _digest_factors(table.shape[1])
    mask = pos < n[:, None]
    raw = table[m[:, ROW]]
    valid = (raw >= 0) & (raw < kv.shape[0])
    rows = kv[np.where(mask & valid, raw, 0)]          # [b, width, kv_width]
    foreign = rows[..., rid_c] != m[:, RID, None]
    if pfx is not None:
        foreign &= pos >= m[:, pfx, None]
    bad = mask & (~valid | (rows[..., pos_c] != pos) | foreign)
    terms = rows[..., tok_c] % DIGEST_M
    terms *= factor
    terms %= DIGEST_M
    terms *= mask
    out[:b, R.C_LEN] = n
    out[:b, R.C_DIGEST] = _sum(terms, 1) % DIGEST_M
    if not np.count_nonzero(bad):    # the common case: no entry read a wrong slot
        out[:b, R.C_BAD] = 0
        out[:b, R.C_SLOT] = -1
        out[:b, R.C_POS] = -1
        at = rows[:, 0]
    else:
        anybad = _any(bad, 1)
        first = np.where(anybad, bad.argmax(1), 0)
        at = rows[np.arange(b), first]
        out[:b, R.C_BAD] = _sum(bad, 1)
        out[:b, R.C_SLOT] = np.where(anybad, raw[np.arange(b), first], -1)
        out[:b, R.C_POS] = np.where(anybad, first, -1)
    if tags == _TAGS:
        out[:b, R.C_TOK:R.C_RID + 1] = at[:, :3]
    else:
        out[:b, R.C_TOK] = at[:, tok_c]
        out[:b, R.C_KPOS] = at[:, pos_c]
        out[:b, R.C_RID] = at[:, rid_c]


assert (R.C_LEN, R.C_BAD, R.C_SLOT, R.C_POS, R.C_TOK, R.C_KPOS, R.C_RID, R.C_DIGEST) == \
    tuple(range(8))     # the record's first columns, in this order


@host_twin(C.draft_canary)
def draft_canary(kv, table, meta, lens, out, tags, b, prefill, pfx, shift):
    m = meta[:b]
    n = np.maximum(m[:, START] + m[:, N] - shift, 0) if prefill else lens[:b]
    canary(kv, table, meta, n, out[:, R.DK_LEN:R.DK_DIGEST + 1], tags, b, False, pfx)
    out[:b, R.DK_SHIFT] = shift


@host_twin(C.canary_with_draft)
def canary_with_draft(kv, table, meta, lens, out, tags, b, prefill, pfx, dkv, dtags, shift):
    canary(kv, table, meta, lens, out, tags, b, prefill, pfx)
    draft_canary(dkv, table, meta, lens, out, dtags, b, prefill, pfx, shift)


def _canary_clean(kv, idx, raw, c, out, tags, n, factor, rid, shared, i=0) -> bool:
    """``_canary_one``'s common case, by columns: every slot in the pool, every position
    and (past the shared prefix) every request tag as expected; then the record is the
    digest, no bad slot and the first position's tags. False (nothing written) in any
    other case, which the position-at-a-time loop records."""
    size = kv.shape[0]
    if min(raw) < 0 or max(raw) >= size:
        return False
    cols = kv[idx].T.tolist()
    toks, poss, rids = cols[tags[0]], cols[tags[1]], cols[tags[2]]
    s0 = min(max(shared, 0), c)
    if poss != list(range(c)) or rids[s0:] != [rid] * (c - s0):
        return False
    D = DIGEST_M
    digest = sum([t % D * f % D for t, f in zip(toks, factor)]) % D
    out[i, :R.C_DIGEST + 1] = [n, 0, -1, -1, toks[0], poss[0], rids[0], digest]
    return True


def _canary_one(kv, table, m, n, out, tags, pfx, i=0):
    """``canary`` of one entry (most batches have one to four; ``m``: its meta row as
    Python ints, ``n``: its read length, ``i``: its record's row in ``out``; a row in
    the table, a pool that is not empty): its record from the first ``n`` positions of its
    table row only, where the mask of the general case is all true (past ``n`` nothing
    counts, and a position past it reads slot 0), a position at a time on Python ints
    (int64 KV: every term stays below 2**62, where both agree) after two gathers."""
    tok_c, pos_c, rid_c = tags
    c = min(max(n, 0), table.shape[1])
    idx = table[m[ROW], :c]
    raw = idx.tolist()
    size = kv.shape[0]
    factor = _digest_factors(table.shape[1])[2]
    rid, shared = m[RID], (m[pfx] if pfx is not None else 0)
    if c and out.shape[1] > R.C_DIGEST and _canary_clean(kv, idx, raw, c, out, tags, n,
                                                          factor, rid, shared, i):
        return
    rows = kv[[s if 0 <= s < size else 0 for s in raw]].tolist() if c else []
    digest = nbad = 0
    first = -1
    for p in range(c):
        r = rows[p]
        if (not 0 <= raw[p] < size or r[pos_c] != p
                or (r[rid_c] != rid and p >= shared)):
            nbad += 1
            if first < 0:
                first = p
        digest += r[tok_c] % DIGEST_M * factor[p] % DIGEST_M
    rec = out[i]
    rec[R.C_LEN] = n
    rec[R.C_DIGEST] = digest % DIGEST_M
    if not nbad:
        rec[R.C_BAD], rec[R.C_SLOT], rec[R.C_POS] = 0, -1, -1
        at = rows[0] if c else kv[0].tolist()
    else:
        rec[R.C_BAD], rec[R.C_SLOT], rec[R.C_POS] = nbad, raw[first], first
        at = rows[first]
    rec[R.C_TOK], rec[R.C_KPOS], rec[R.C_RID] = at[tok_c], at[pos_c], at[rid_c]


# -- backup_check.py -----------------------------------------------------------------------
def _rows_in(rows, n: int) -> bool:
    """Whether every row index is in ``0..n-1`` (the Python-int paths' case: the array
    path wraps a negative one or refuses one past the end, as torch does)."""
    for r in rows:
        if not 0 <= r < n:
            return False
    return True


def _reset_span_few(span, meta, b) -> bool:
    if not (_ints(b, meta) and span.dtype is _I64 and span.ndim == 2
            and span.shape[1] == BK.SPAN):
        return False
    ms = meta[:b].tolist()
    rows = [e[ROW] for e in ms]
    if not _rows_in(rows, span.shape[0]):
        return False
    old = span[rows]
    for i, (r, e) in enumerate(zip(rows, ms)):
        span[r] = _int64(e[START] + e[N]) if e[LAST] == 1 else old[i]
    return True


@host_twin(BK.reset_span)
def reset_span(span, meta, b):
    if b <= _FEW_B and _reset_span_few(span, meta, b):
        return
    m = meta[:b]
    rows, last = m[:, ROW], (m[:, LAST] == 1)[:, None]
    ctx = np.broadcast_to((m[:, START] + m[:, N])[:, None], (b, BK.SPAN))
    span[rows] = np.where(last, ctx, span[rows])


def _note_backup_few(span, meta, lens, out_acc, b) -> bool:
    if not (_ints(b, meta, lens, out_acc) and span.dtype is _I64 and span.ndim == 2
            and span.shape[1] > 1):
        return False
    rows = meta[:b, ROW].tolist()
    if not _rows_in(rows, span.shape[0]):
        return False
    ends = [span[r, 1] for r in rows]
    for r, end, L, a in zip(rows, ends, lens[:b].tolist(), out_acc[:b].tolist()):
        span[r, 1] = _int64(L + a) if end == L else end
    return True


@host_twin(BK.note_backup)
def note_backup(span, meta, lens, out_acc, b):
    if b <= _FEW_B and _note_backup_few(span, meta, lens, out_acc, b):
        return
    rows = meta[:b, ROW]
    end = span[rows, 1]
    span[rows, 1] = np.where(end == lens[:b], lens[:b] + out_acc[:b], end)


assert (R.BK_START, R.BK_END, R.BK_BAD, R.BK_POS, R.BK_TOK, R.BK_KPOS, R.BK_RID) == \
    tuple(range(R.BK_START, R.BK_START + 7))    # one slice of the record


def _check_backup_few(kv, host_kv, table, host_table, span, meta, out, tags, b) -> bool:
    """``check_backup`` of a few entries on Python ints: per entry only the positions
    of its span, compared row by row after one gather from each pool; False, having
    written nothing, where a row or tag column is out of range or the shapes are not
    the kernel's usual ones (the array path wraps, broadcasts or refuses those as
    torch does)."""
    if not (_ints(b, meta, out) and _ints(0, kv, host_kv, table, host_table, span)
            and kv.ndim == host_kv.ndim == table.ndim == host_table.ndim == span.ndim == 2
            and kv.shape[0] and host_kv.shape[0] and kv.shape[1] == host_kv.shape[1]
            and table.shape[1] == host_table.shape[1] and table.shape[1] and span.shape[1] >= 2
            and out.shape[1] > R.BK_RID):
        return False
    for c in tags:
        if not 0 <= c < kv.shape[1]:
            return False
    n_rows = min(span.shape[0], table.shape[0], host_table.shape[0])
    rows = meta[:b, ROW].tolist()
    for r in rows:
        if not 0 <= r < n_rows:
            return False
    tok_c, pos_c, rid_c = tags
    width, ks, hs = table.shape[1], kv.shape[0], host_kv.shape[0]
    recs = []
    for r in rows:
        s, e = span[r, :2].tolist()
        src, dst = table[r].tolist(), host_table[r].tolist()
        span_p = range(max(s, 0), min(e, width))
        ok = [p for p in span_p if 0 <= src[p] < ks and 0 <= dst[p] < hs]
        same = set()
        if ok:
            held = host_kv[[dst[p] for p in ok]].tolist()
            now = kv[[src[p] for p in ok]].tolist()
            same = {p for p, x, y in zip(ok, held, now) if x == y}
        bad = [p for p in span_p if p not in same]
        first = bad[0] if bad else 0
        held_at = dst[first] if (first in span_p and 0 <= src[first] < ks
                                 and 0 <= dst[first] < hs) else 0   # else the padding slot
        at = host_kv[held_at].tolist()
        recs.append([s, e, len(bad), bad[0] if bad else -1, at[tok_c], at[pos_c], at[rid_c]])
    out[:b, R.BK_START:R.BK_RID + 1] = recs
    return True


@host_twin(BK.check_backup)
def check_backup(kv, host_kv, table, host_table, span, meta, out, tags, b):
    if b <= _FEW_B and _check_backup_few(kv, host_kv, table, host_table, span, meta, out,
                                         tags, b):
        return
    tok_c, pos_c, rid_c = tags
    rows = meta[:b, ROW]
    s, e = span[rows, 0], span[rows, 1]
    pos = np.arange(table.shape[1])
    mask = (pos >= s[:, None]) & (pos < e[:, None])
    src, dst = table[rows], host_table[rows]
    valid = (src >= 0) & (src < kv.shape[0]) & (dst >= 0) & (dst < host_kv.shape[0])
    src = np.where(mask & valid, src, 0)
    dst = np.where(mask & valid, dst, 0)
    held = host_kv[dst]
    bad = mask & (~valid | _any(held != kv[src], -1))
    anybad = _any(bad, 1)
    first = np.where(anybad, bad.argmax(1), 0)
    at = held[np.arange(b), first]
    out[:b, R.BK_START] = s
    out[:b, R.BK_END] = e
    out[:b, R.BK_BAD] = _sum(bad, 1)
    out[:b, R.BK_POS] = np.where(anybad, first, -1)
    out[:b, R.BK_TOK] = at[:, tok_c]
    out[:b, R.BK_KPOS] = at[:, pos_c]
    out[:b, R.BK_RID] = at[:, rid_c]


# -- drafts_eagle.py -----------------------------------------------------------------------
def _eagle_prefill_few(hm, kv, ekv, table, ptok, meta, out_tok, fm_draft, fm_hid, n, b,
                      dst, topk) -> bool:
    """``eagle_prefill`` on Python ints: the prompt tokens' pairs from running
    sums of their table rows' terms, then each entry's final pair, head and stash; False,
    having written nothing, where the array path must run."""
    if kv.shape[1] != hm.kv_width or ekv.shape[1] != hm.eagle_width:
        return False
    width_t, size = table.shape[1], min(kv.shape[0], ekv.shape[0])
    toks, ms = ptok[:n].tolist(), meta[:b].tolist()
    need = {}                          # table row -> positions hashed, written or read
    for r, q, _, _ in toks:
        if not 0 <= q <= width_t:      # (q - 1).clamp(min=0) + 1 within the row
            return False
        need[r] = max(need.get(r, 1), q)
    ctxs = []
    for e in ms:
        c = _int64(e[START] + e[N])
        if not 1 <= c <= width_t:
            return False
        ctxs.append(c)
        need[e[ROW]] = max(need.get(e[ROW], 1), c)
    dests = [e[dst] for e in ms]
    n_fm = min(fm_draft.shape[0], fm_hid.shape[0])
    for d in dests:
        if not 0 <= d < n_fm:
            return False
    slots = {}
    for r, c in need.items():
        slots[r] = hm.row_slots(table, r, c, size)
        if slots[r] is None:
            return False
    pre = {r: hm.row_hashes(kv[s], width_t) for r, s in slots.items()}  # target hiddens
    for r, q, t, rid in toks:
        if q >= 1:                     # kept: the last kept writer of a slot wins
            ekv[slots[r][q - 1]] = (t, q - 1, rid, pre[r][q])
    outs = out_tok[:b, 0].tolist()
    for e, c, o in zip(ms, ctxs, outs):
        if e[LAST] == 1:
            ekv[slots[e[ROW]][c - 1]] = (o if e[SAMPLE] == 1 else e[NEXT], c - 1, e[RID],
                                         pre[e[ROW]][c])
    heads = [hm.eagle_out_rows(ekv[slots[e[ROW]][:c]].tolist(), c - 1, width_t, e[SEED],
                               e[SEEDED] == 1, topk) for e, c in zip(ms, ctxs)]
    old_d, old_h = fm_draft[dests], fm_hid[dests]
    for i, (e, d, (g, d1)) in enumerate(zip(ms, dests, heads)):
        keep = e[LAST] == 1 or dst != ROW          # ``_stores``
        fm_draft[d] = d1 if keep else old_d[i]
        fm_hid[d] = g if keep else old_h[i]
    return True


@host_twin(DE.eagle_prefill)
def eagle_prefill(model, head, kv, ekv, table, ptok, meta, out_tok, fm_draft, fm_hid, n, b,
                  dst=ROW, topk=1):
    hm = _model(model)
    if b <= _FEW_B and n <= _FEW_TOKENS and _ints(b, meta, out_tok) \
            and _ints(0, kv, ekv, table, ptok, fm_draft, fm_hid) \
            and hasattr(hm, "tree_head") and ptok.shape[1] == 4 and out_tok.shape[1] \
            and _fm_draft_ok(fm_draft, topk) and fm_hid.ndim == 2 \
            and _eagle_prefill_few(hm, kv, ekv, table, ptok, meta, out_tok, fm_draft, fm_hid,
                                   n, b, dst, topk):
        return
    p = ptok[:n]
    rows, q = p[:, P_ROW], p[:, P_POS]
    pos = np.maximum(q - 1, 0)
    feats = hm.target_hidden(kv, table, rows, pos + 1)
    hm.eagle_write(ekv, table, rows, pos, p[:, P_TOK], feats, p[:, P_RID], keep=q >= 1)
    m = meta[:b]
    mrows, ctx, last = m[:, ROW], m[:, START] + m[:, N], m[:, LAST] == 1
    tok = np.where(m[:, SAMPLE] == 1, out_tok[:b, 0], m[:, NEXT])
    feats = hm.target_hidden(kv, table, mrows, ctx)
    hm.eagle_write(ekv, table, mrows, ctx - 1, tok, feats, m[:, RID], keep=last)
    g, d1 = hm.eagle_out(ekv, table, mrows, ctx - 1, m[:, SEED], m[:, SEEDED] == 1, topk)
    slots, keep = m[:, dst], _stores(last, dst)
    fm_draft[slots] = np.where(keep if topk == 1 else keep[:, None], d1, fm_draft[slots])
    fm_hid[slots] = np.where(keep[:, None], g.astype(fm_hid.dtype, copy=False), fm_hid[slots])


@host_twin(DE.eagle_resolve)
def eagle_resolve(model, fm_draft, fm_hid, meta, drafts, lens, hid, b, gate=None, hcol=None,
                  src=ROW):
    hm = _model(model)
    m = meta[:b]
    slots = m[:, src]
    drafts[:b, 1] = _round_tokens(hm, m, lens[:b], fm_draft[slots], drafts[:b, 1], gate, hcol)
    hid[:b] = fm_hid[slots]


def _eagle_plan(hm, ekv, table, ents):
    """The EAGLE KV slots a few entries write and read, before anything is written:
    per entry (``ents``: (row, write positions, the head's position)) the slots of its
    table row up to the later of both; None where the array path must run."""
    size, plan = ekv.shape[0], []
    if ekv.shape[1] != hm.eagle_width:
        return None
    for row, upto, at in ents:
        slots = hm.row_slots(table, row, max(upto, at + 1), size) if at >= 0 else None
        if slots is None:
            return None
        plan.append(slots)
    return plan


def _eagle_outs(hm, ekv, table, plan, ats, ms, topk=1):
    """``eagle_out`` per entry at position ``ats[i]`` on Python ints, after the writes:
    (hidden, draft token or, for a tree, its ``topk`` candidates) each."""
    width = table.shape[1]
    return [hm.eagle_out_rows(ekv[slots[:at + 1]].tolist(), at, width, e[SEED], e[SEEDED] == 1,
                              topk)
            for slots, at, e in zip(plan, ats, ms)]


def _fm_draft_ok(fm_draft, topk: int) -> bool:
    """Whether the FutureMap's draft rows take one entry's head output as they are: a
    token per slot for a chain, ``topk`` of them for a tree."""
    return fm_draft.ndim == 1 if topk == 1 else (fm_draft.ndim == 2
                                                 and fm_draft.shape[1] == topk)


def _eagle_step_few(hm, ekv, table, meta, drafts, lens, hid, j, b, gate) -> bool:
    """``eagle_step`` of a few entries on Python ints (no host-lengths cut); False,
    having written nothing, where the array path must run."""
    ms, ls = meta[:b].tolist(), lens[:b].tolist()
    ats = [L + j - 2 for L in ls]
    plan = _eagle_plan(hm, ekv, table, [(e[ROW], at + 1, at) for e, at in zip(ms, ats)])
    if plan is None:
        return False
    toks, feats = drafts[:b, j - 1].tolist(), hid[:b, 0].tolist()
    for slots, e, at, t, f in zip(plan, ms, ats, toks, feats):
        if gate is None or e[gate] == 1:      # kept: the last kept writer of a slot wins
            ekv[slots[at]] = (t, at, e[RID], f)
    outs = _eagle_outs(hm, ekv, table, plan, ats, ms)
    old = drafts[:b, j].tolist()
    for i, (e, (g, d)) in enumerate(zip(ms, outs)):
        drafts[i, j] = d if gate is None or e[gate] == 1 else old[i]
        hid[i] = g
    return True


@host_twin(DE.eagle_step)
def eagle_step(model, head, ekv, table, meta, drafts, lens, hid, j, b, gate=None, hcol=None):
    hm = _model(model)
    if b <= _FEW_B and hcol is None and _ints(b, meta, lens, drafts, hid) \
            and _ints(0, ekv, table) and hasattr(hm, "eagle_out_rows") \
            and drafts.shape[1] > j >= 1 and hid.ndim == 2 and hid.shape[1] \
            and _eagle_step_few(hm, ekv, table, meta, drafts, lens, hid, j, b, gate):
        return
    m = meta[:b]
    rows, pos = m[:, ROW], lens[:b] + (j - 2)
    hm.eagle_write(ekv, table, rows, pos, drafts[:b, j - 1], hid[:b], m[:, RID],
                   keep=None if gate is None else m[:, gate] == 1)
    g, d = hm.eagle_out(ekv, table, rows, pos, m[:, SEED], m[:, SEEDED] == 1)
    drafts[:b, j] = _round_tokens(hm, m, lens[:b], d, drafts[:b, j], gate, hcol)
    hid[:b] = g.astype(hid.dtype, copy=False)


def _eagle_extend_few(hm, kv, ekv, table, meta, lens, out_tok, out_acc, fm_draft, fm_hid,
                     width, b, by_position, dst, topk) -> bool:
    """``eagle_extend`` of a few entries on Python ints; False, having written nothing,
    where the array path must run."""
    ms, ls, accs = meta[:b].tolist(), lens[:b].tolist(), out_acc[:b].tolist()
    ats = [L + a - 1 for L, a in zip(ls, accs)]
    width_t, size = table.shape[1], kv.shape[0]
    if kv.shape[1] != hm.kv_width:
        return False
    plan = _eagle_plan(hm, ekv, table, [(e[ROW], L + width, at)
                                        for e, L, at in zip(ms, ls, ats)])
    if plan is None:
        return False
    dests = range(b) if by_position else [e[dst] for e in ms]
    n_fm = min(fm_draft.shape[0], fm_hid.shape[0])
    for d in dests:
        if not 0 <= d < n_fm:
            return False
    feats = []
    for slots, L in zip(plan, ls):
        if L < 0:
            return False
        tslots = slots[:L + width]        # the target KV the hidden states hash
        for x in tslots:
            if not 0 <= x < size:
                return False
        feats.append(hm.row_hashes(kv[tslots], width_t))
    toks = out_tok[:b, :width].tolist()
    for slots, e, L, a, tk, pre in zip(plan, ms, ls, accs, toks, feats):
        rid = e[RID]
        for o in range(min(max(a, 0), width)):     # kept: the accepted positions
            ekv[slots[L + o]] = (tk[o], L + o, rid, pre[L + o + 1])
    for d, (g, d1) in zip(dests, _eagle_outs(hm, ekv, table, plan, ats, ms, topk)):
        fm_draft[d] = d1
        fm_hid[d] = g
    return True


@host_twin(DE.eagle_extend)
def eagle_extend(model, head, kv, ekv, table, meta, lens, out_tok, out_acc, fm_draft, fm_hid,
                 width, b, by_position=False, dst=ROW, topk=1):
    hm = _model(model)
    if b <= _FEW_B and _ints(b, meta, lens, out_tok, out_acc) \
            and _ints(0, kv, ekv, table, fm_draft, fm_hid) and hasattr(hm, "tree_head") \
            and out_tok.shape[1] >= width and _fm_draft_ok(fm_draft, topk) and fm_hid.ndim == 2 \
            and _eagle_extend_few(hm, kv, ekv, table, meta, lens, out_tok, out_acc, fm_draft,
                                  fm_hid, width, b, by_position, dst, topk):
        return
    m = meta[:b]
    offs = np.arange(width)
    pos = (lens[:b, None] + offs).reshape(-1)
    rows = _flat(m[:, ROW], b, width)
    keep = (offs < out_acc[:b, None]).reshape(-1)
    feats = hm.target_hidden(kv, table, rows, pos + 1)
    hm.eagle_write(ekv, table, rows, pos, out_tok[:b, :width].reshape(-1), feats,
                   _flat(m[:, RID], b, width), keep=keep)
    last = lens[:b] + out_acc[:b] - 1
    g, d1 = hm.eagle_out(ekv, table, m[:, ROW], last, m[:, SEED], m[:, SEEDED] == 1, topk)
    dest = np.arange(b) if by_position else m[:, dst]
    fm_draft[dest] = d1
    fm_hid[dest] = g.astype(fm_hid.dtype, copy=False)


@host_twin(DE.tree_eagle_resolve)
def tree_eagle_resolve(model, fm_draft, fm_hid, meta, drafts, lens, hid, topk, b, hcol=None,
                       src=ROW):
    hm = _model(model)
    m = meta[:b]
    slots = m[:, src]
    drafts[:b, 1:1 + topk] = _tree_cut(hm, m, lens[:b], fm_draft[slots], hcol)
    hid[:b] = fm_hid[slots]


def _tree_eagle_step_few(hm, ekv, table, meta, drafts, lens, hid, j, topk, b) -> bool:
    """``tree_eagle_step`` of a few entries on Python ints (no host-lengths cut); False,
    having written nothing, where the array path must run."""
    src, lo, hi = K.tree_node(j - 1, 0, topk), K.tree_node(j, 0, topk), K.tree_node(j + 1, 0, topk)
    if not (0 <= src and hi - lo == topk and drafts.shape[1] >= hi):
        return False
    ms, ls = meta[:b].tolist(), lens[:b].tolist()
    ats = [L + j - 2 for L in ls]
    plan = _eagle_plan(hm, ekv, table, [(e[ROW], at + 1, at) for e, at in zip(ms, ats)])
    if plan is None:
        return False
    toks, feats = drafts[:b, src].tolist(), hid[:b, 0].tolist()
    for slots, e, at, t, f in zip(plan, ms, ats, toks, feats):
        ekv[slots[at]] = (t, at, e[RID], f)          # the last writer of a slot wins
    outs = _eagle_outs(hm, ekv, table, plan, ats, ms, topk)
    drafts[:b, lo:hi] = [c for _, c in outs]
    for i, (g, _) in enumerate(outs):
        hid[i] = g
    return True


@host_twin(DE.tree_eagle_step)
def tree_eagle_step(model, head, ekv, table, meta, drafts, lens, hid, j, topk, b, hcol=None):
    hm = _model(model)
    if b <= _FEW_B and hcol is None and topk > 1 and _ints(b, meta, lens, drafts, hid) \
            and _ints(0, ekv, table) and hasattr(hm, "tree_head") and hid.ndim == 2 \
            and hid.shape[1] and _tree_eagle_step_few(hm, ekv, table, meta, drafts, lens, hid, j,
                                                      topk, b):
        return
    m = meta[:b]
    rows, pos = m[:, ROW], lens[:b] + (j - 2)
    hm.eagle_write(ekv, table, rows, pos, drafts[:b, K.tree_node(j - 1, 0, topk)], hid[:b],
                   m[:, RID])
    g, c = hm.eagle_out(ekv, table, rows, pos, m[:, SEED], m[:, SEEDED] == 1, topk)
    drafts[:b, K.tree_node(j, 0, topk):K.tree_node(j + 1, 0, topk)] = _tree_cut(
        hm, m, lens[:b], c, hcol)
    hid[:b] = g.astype(hid.dtype, copy=False)


# -- drafts_mtp.py -------------------------------------------------------------------------
@host_twin(DM.mtp_prefill_seed)
def mtp_prefill_seed(model, kv, table, meta, fm_hid, b, dst=ROW):
    hm = _model(model)
    if b == 1 and _ints(1, meta, fm_hid) and fm_hid.ndim == 2 and kv.shape[0] \
            and hasattr(hm, "hidden_one"):
        e = meta[0].tolist()      # one entry (most prefills): its hash on Python ints
        h = hm.hidden_one(kv, table, e[ROW], _int64(e[START] + e[N]))
        slot = e[dst]
        fm_hid[slot] = h if e[LAST] == 1 or dst != ROW else fm_hid[slot]    # ``_stores``
        return
    m = meta[:b]
    rows, last = m[:, ROW], m[:, LAST] == 1
    h = hm.target_hidden(kv, table, rows, m[:, START] + m[:, N]).astype(fm_hid.dtype, copy=False)
    slots, keep = m[:, dst], _stores(last, dst)
    fm_hid[slots] = np.where(keep[:, None], h, fm_hid[slots])


def _mtp_step_few(hm, kv, table, meta, drafts, lens, fm_hid, hid, j, b, frozen, gate,
                  src) -> bool:
    """``mtp_step`` of a few entries on Python ints (no host-lengths cut); False, having
    written nothing, where the array path must run."""
    ms, ls = meta[:b].tolist(), lens[:b].tolist()
    width_t, size = table.shape[1], kv.shape[0]
    if j == 1:
        n = fm_hid.shape[0]
        feats = []
        for e in ms:
            if not 0 <= e[src] < n:
                return False
            feats.append(e[src])
        feats = fm_hid[feats, 0].tolist()
    else:
        feats = hid[:b, 0].tolist()
    plans = []
    for e, L in zip(ms, ls):
        if not -_SANE < L < _SANE:
            return False
        slots = hm.row_slots(table, e[ROW], min(max(L + frozen, 0), width_t), size)
        if slots is None:
            return False
        plans.append(slots)
    toks, old = drafts[:b, j - 1].tolist(), drafts[:b, j].tolist()
    outs = [hm.mtp_rows(kv[slots].tolist(), width_t, L + j - 1, t, f, e[SEED], e[SEEDED] == 1)
            for slots, e, L, t, f in zip(plans, ms, ls, toks, feats)]
    for i, (e, (g, d)) in enumerate(zip(ms, outs)):
        drafts[i, j] = d if gate is None or e[gate] == 1 else old[i]
        hid[i] = g
    return True


@host_twin(DM.mtp_step)
def mtp_step(model, head, kv, table, meta, drafts, lens, fm_hid, hid, j, b, frozen=0,
             gate=None, hcol=None, src=ROW):
    hm = _model(model)
    if b <= _FEW_B and hcol is None and _ints(b, meta, lens, drafts, hid) \
            and _ints(0, kv, table, fm_hid) and hasattr(hm, "mtp_rows") \
            and drafts.shape[1] > j >= 1 and hid.ndim == 2 and hid.shape[1] \
            and fm_hid.ndim == 2 and fm_hid.shape[1] and kv.shape[1] == hm.kv_width \
            and _mtp_step_few(hm, kv, table, meta, drafts, lens, fm_hid, hid, j, b, frozen,
                              gate, src):
        return
    m = meta[:b]
    rows = m[:, ROW]
    feats = fm_hid[m[:, src]] if j == 1 else hid[:b]
    g, d = hm.mtp_step(kv, table, rows, lens[:b] + frozen, lens[:b] + (j - 1), drafts[:b, j - 1],
                       feats, m[:, SEED], m[:, SEEDED] == 1)
    drafts[:b, j] = _round_tokens(hm, m, lens[:b], d, drafts[:b, j], gate, hcol)
    hid[:b] = g.astype(hid.dtype, copy=False)


@host_twin(DM.mtp_seed)
def mtp_seed(model, kv, table, meta, lens, out_acc, fm_hid, b, dst=ROW):
    hm = _model(model)
    if b == 1 and _ints(1, meta, lens, out_acc, fm_hid) and fm_hid.ndim == 2 and kv.shape[0] \
            and hasattr(hm, "hidden_one"):
        e = meta[0].tolist()      # one entry: its hash on Python ints
        fm_hid[e[dst]] = hm.hidden_one(kv, table, e[ROW],
                                       _int64(int(lens[0]) + int(out_acc[0])))
        return
    rows = meta[:b, ROW]
    fm_hid[meta[:b, dst]] = hm.target_hidden(kv, table, rows, lens[:b] + out_acc[:b]).astype(
        fm_hid.dtype, copy=False)
