"""Device work: the closures the engine launches. Each takes every tensor it touches
as an argument (bound at launch) and communicates only through buffers; Python ints
(batch sizes, k) are bound at launch too. Nothing here reads host state.

Staged metadata, one row per batch entry (``meta_width`` columns), is copied from pinned
host memory on the schedule stream. Decode state lives in the FutureMap
(``fm_tok[slot]``: the next input token, ``fm_len[slot]``: the committed length; with
zero bubble ``fm_drafts[slot]``: the pre-drafted round's k draft tokens). A kernel that
resolves takes the meta column of the slot it reads (``src``), one that stashes the
column of the slot it writes (``dst``): ``ROW`` for the row-indexed FutureMap,
``FSRC``/``FDST`` for the ring (``future_map``).

Draft kernels take the round they draft (``drafts``, ``lens``: the round's scratch and
start lengths) and two optional meta columns: ``gate``, the entries the round drafts for
(None: all), and ``hcol``, the host's sequence lengths of the round for a model that reads
them (None: it does not); see ``drafts_round``.
"""
from __future__ import annotations

from ..device.xp import of, one_source

# meta columns (LSUM: the host's seq_lens_sum of the batch with verify_sync, else 0)
ROW, RID, SEED, SEEDED, START, N, SAMPLE, LAST, NEXT, LSUM = range(10)
# draft rounds (drafts_round): draft at the step's start / pre-draft the next round (0/1);
# the host's sequence lengths (seq_lens_cpu) of this round and of the pre-drafted one
NOW, AHEAD, HLEN, HNEXT = range(10, 14)
META = 14
# the ring FutureMap (future_map.py): the slot an entry resolves from and the one it
# stashes into; with the row-indexed FutureMap both are the ROW column (not staged)
FSRC, FDST = range(14, 16)


def meta_width(cfg) -> int:
    """Columns of the staged metadata: ``META``, the ring's two slot columns, and with
    the prefix cache the ``pfx_column``."""
    return (META + 2 if cfg.future_map == "ring" else META) + int(cfg.prefix_cache)


def pfx_column(cfg):
    """With the prefix cache, the meta column of an entry's shared prefix length: its
    positions ``0..PFX-1`` are cached KV that another request wrote (docs/design.md
    §4.13); None without it (the metadata keeps its old width)."""
    return meta_width(cfg) - 1 if cfg.prefix_cache else None
# prefill token staging columns: row, position, token, request id
P_ROW, P_POS, P_TOK, P_RID = range(4)


@one_source
def write_table(table, cells, n):
    """Schedule stream: ``table[row, pos] = slot`` for the first ``n`` staged cells.
    A row-major offset, as a device kernel computes it: no bound check per row (a cell
    past its row lands in the next one). Cells past the table's end are not staged
    (``table_cells``): filtering them here would sync the host on their count."""
    c = cells[:n]
    w = table.shape[1]
    table[c[:, 0] + c[:, 1] // w, c[:, 1] % w] = c[:, 2]


def table_cells(cells, shape):
    """The staged cells of ``write_table``: those inside the table (row-major), in order.
    One past the end is lost, as on a GPU, where it lands in whatever follows."""
    rows, w = shape
    return [c for c in cells if c[0] * w + c[1] < rows * w]


@one_source
def prefill_write(model, kv, draft_kv, table, ptok, n):
    """Write the KV of ``n`` staged prompt tokens (target, and draft when present)."""
    model, p = of(kv).model(model), ptok[:n]
    args = (table, p[:, P_ROW], p[:, P_POS], p[:, P_TOK], p[:, P_RID])
    model.write_kv(kv, *args)
    if draft_kv is not None:
        model.write_draft_kv(draft_kv, *args)


@one_source
def prefill_finish(model, kv, table, fm_tok, fm_len, meta, out_tok, out_acc, b, dst=ROW):
    """Sample the first output token where a chunk ends the prompt; stash the next
    decode input (sampled, or host-known after a retraction) into the FutureMap. A
    request-pool row keeps its value until the last chunk; a ring slot (``dst`` not
    ``ROW``) is the entry's own, and every chunk stores there what it sampled, as
    SGLang's chunks do (``stores``)."""
    xp = of(kv)
    model, m = xp.model(model), meta[:b]
    rows, ctx = m[:, ROW], m[:, START] + m[:, N]
    t = model.target(kv, table, rows, ctx, m[:, SEED], m[:, SEEDED] == 1)
    sample, last = m[:, SAMPLE] == 1, m[:, LAST] == 1
    out_tok[:b, 0] = xp.where(sample, t, -1)
    out_acc[:b] = xp.long(sample)
    nxt = xp.where(sample | ~last, t, m[:, NEXT])
    slots, keep = m[:, dst], stores(last, dst)
    fm_tok[slots] = xp.where(keep, nxt, fm_tok[slots])
    fm_len[slots] = xp.where(keep, ctx, fm_len[slots])


def stores(last, dst):
    """The prefill entries that stash into the FutureMap: the last chunks with the
    row-indexed one; every entry with the ring (its slot is its own)."""
    return last if dst == ROW else of(last).ones_like(last)


@one_source
def resolve(fm_tok, fm_len, meta, drafts, lens, b, src=ROW):
    """Read this step's inputs from the FutureMap (stashed by an earlier step)."""
    slots = meta[:b, src]
    drafts[:b, 0] = fm_tok[slots]
    lens[:b] = fm_len[slots]


@one_source
def seq_lens_sum(meta, lens, out, b, from_host):
    """The batch's total sequence length for the attention metadata: the host's value
    staged in ``meta`` (verify_sync) or summed on the device."""
    out[0] = meta[0, LSUM] if from_host else lens[:b].sum()


@one_source
def publish_lens(lens, out_acc, new_lens, b):
    """The new committed lengths after a verify, for the host's next seq_lens_sum."""
    new_lens[:b] = lens[:b] + out_acc[:b]


@one_source
def backup_kv(kv, host_kv, table, host_table, meta, lens, out_acc, width, b):
    """Backup stream: copy the KV of each entry's accepted positions to the host pool."""
    xp, m = of(kv), meta[:b]
    offs = xp.arange(width, kv)
    pos = (lens[:b, None] + offs).reshape(-1)
    rows = xp.repeat_each(m[:, ROW], width)
    keep = (offs[None, :] < out_acc[:b, None]).reshape(-1)
    src, dst = table[rows, pos], host_table[rows, pos]
    dst = xp.where(keep, dst, dst[0])     # dropped positions rewrite the first kept cell
    src = xp.where(keep, src, src[0])
    host_kv[dst] = kv[src]


def gate_mask(m, gate):
    """The entries a gated round drafts for (None: all)."""
    return None if gate is None else m[:, gate] == 1


def round_tokens(model, m, lens, new, old, gate, hcol):
    """A draft step's tokens: cut by the host's lengths (column ``hcol``) for a model
    that reads them; entries outside the round (``gate``) keep ``old``."""
    if hcol is not None:
        new = model.host_lens_cut(new, lens, m[:, hcol])
    return new if gate is None else of(new).where(m[:, gate] == 1, new, old)


@one_source
def draft_step(model, draft_kv, table, meta, drafts, lens, j, b, gate=None, hcol=None):
    """Draft step ``j`` (1..k): write the previous token's draft KV, draft token j."""
    model, m = of(draft_kv).model(model), meta[:b]
    rows, pos = m[:, ROW], lens[:b] + (j - 1)
    model.write_draft_kv(draft_kv, table, rows, pos, drafts[:b, j - 1], m[:, RID],
                         keep=gate_mask(m, gate))
    d = model.draft(draft_kv, table, rows, pos + 1, m[:, SEED], m[:, SEEDED] == 1)
    drafts[:b, j] = round_tokens(model, m, lens[:b], d, drafts[:b, j], gate, hcol)


@one_source
def restore(fm_drafts, meta, drafts, k, b, src=ROW):
    """Zero bubble: the drafts of entries with a pre-drafted round, from the FutureMap."""
    m = meta[:b]
    pre = (m[:, NOW] == 0)[:, None]
    drafts[:b, 1:k + 1] = of(meta).where(pre, fm_drafts[m[:, src]], drafts[:b, 1:k + 1])


@one_source
def ahead_start(meta, lens, out_tok, out_acc, next_drafts, next_lens, b):
    """Zero bubble, after the draft-extend: the next round's input (the bonus token) and
    start length; 0 for entries that do not pre-draft (their positions stay in the row)."""
    xp, m, acc = of(meta), meta[:b], out_acc[:b]
    next_drafts[:b, 0] = xp.gather(out_tok[:b], 1, (acc - 1)[:, None])[:, 0]
    next_lens[:b] = xp.where(m[:, AHEAD] == 1, lens[:b] + acc, 0)


@one_source
def ahead_stash(fm_drafts, meta, next_drafts, k, b, dst=ROW):
    """Zero bubble: stash the pre-drafted round's k drafts at the request's FutureMap slot."""
    slots, ahead = meta[:b, dst], (meta[:b, AHEAD] == 1)[:, None]
    fm_drafts[slots] = of(meta).where(ahead, next_drafts[:b, 1:k + 1], fm_drafts[slots])


@one_source
def verify(model, kv, table, meta, drafts, lens, tgt, width, b):
    """Target over the input and the drafts (``width`` = k+1 positions): writes their
    KV, computes the target token after each."""
    xp = of(kv)
    model, m = xp.model(model), meta[:b]
    offs = xp.arange(width, kv)
    pos = lens[:b, None] + offs                              # [b, width]
    rows = xp.repeat_each(m[:, ROW], width)
    model.write_kv(kv, table, rows, pos.reshape(-1), drafts[:b, :width].reshape(-1),
                   xp.repeat_each(m[:, RID], width))
    seeds = xp.repeat_each(m[:, SEED], width)
    seeded = xp.repeat_each(m[:, SEEDED] == 1, width)
    t = model.target(kv, table, rows, (pos + 1).reshape(-1), seeds, seeded)
    tgt[:b, :width] = t.reshape(b, width)


@one_source
def accept(drafts, tgt, out_tok, out_acc, k, b):
    """Greedy acceptance: the longest prefix of drafts equal to the target's tokens,
    plus the bonus token. ``out_acc`` in 1..k+1; ``out_tok[:, :acc]`` committed."""
    xp = of(drafts)
    match = xp.long(drafts[:b, 1:k + 1] == tgt[:b, :k])
    out_acc[:b] = xp.cumprod(match, 1).sum(1) + 1
    out_tok[:b, :k + 1] = tgt[:b, :k + 1]


@one_source
def draft_extend(model, draft_kv, table, meta, drafts, lens, out_acc, width, b):
    """Bring the draft KV up to the new committed length: accepted inputs only."""
    xp = of(draft_kv)
    model, m = xp.model(model), meta[:b]
    offs = xp.arange(width, draft_kv)
    pos = lens[:b, None] + offs
    keep = (offs[None, :] < out_acc[:b, None]).reshape(-1)
    rows = xp.repeat_each(m[:, ROW], width)
    rid = xp.repeat_each(m[:, RID], width)
    model.write_draft_kv(draft_kv, table, rows, pos.reshape(-1), drafts[:b, :width].reshape(-1),
                         rid, keep=keep)


@one_source
def stash(fm_tok, fm_len, meta, lens, out_tok, out_acc, b, dst=ROW):
    """Publish the next step's input: the bonus token and the new committed length."""
    slots, acc = meta[:b, dst], out_acc[:b]
    fm_tok[slots] = of(meta).gather(out_tok[:b], 1, (acc - 1)[:, None])[:, 0]
    fm_len[slots] = lens[:b] + acc


@one_source
def decode(model, kv, table, meta, drafts, lens, out_tok, out_acc, b):
    """No-spec decode: write the input's KV, sample one token."""
    model, m = of(kv).model(model), meta[:b]
    rows, pos = m[:, ROW], lens[:b]
    model.write_kv(kv, table, rows, pos, drafts[:b, 0], m[:, RID])
    out_tok[:b, 0] = model.target(kv, table, rows, pos + 1, m[:, SEED], m[:, SEEDED] == 1)
    out_acc[:b] = 1


# -- tree drafts (topk > 1, docs/design.md §4.12) ---------------------------------------------
def tree_node(depth: int, rank: int, topk: int) -> int:
    """The index of the rank-``rank`` candidate at ``depth`` (1..k) in a tree's node
    order; node 0 is the root (the verify's input)."""
    return 1 + (depth - 1) * topk + rank


def tree_shape(k: int, topk: int, like):
    """The draft tree as a parent array: node ``tree_node(d, r)`` is the rank-r candidate
    at depth d, a child of the rank-0 node at depth d-1 (the root for d = 1); the root's
    parent is -1. Returns (parent, depth), [1 + k * topk] each, in ``like``'s namespace
    and on its device."""
    xp = of(like)
    i = xp.arange(1 + k * topk, like)
    depth = xp.where(i == 0, 0, (i - 1) // topk + 1)
    parent = xp.where(depth <= 1, 0, 1 + (depth - 2) * topk)
    return xp.where(i == 0, -1, parent), depth


def tree_paths(parent, depth, k: int):
    """[n, k+1]: per node, its ancestor at each depth 0..depth (itself at its own depth
    and past it), found by walking the parent array up."""
    xp, n = of(parent), parent.shape[0]
    node = xp.arange(n, parent)
    path = node[:, None] + xp.zeros((n, k + 1), parent)
    cur = node
    for _ in range(k + 1):
        path[node, depth[cur]] = cur
        cur = xp.where(parent[cur] >= 0, parent[cur], cur)
    return path


@one_source
def tree_draft_step(model, draft_kv, table, meta, drafts, lens, j, topk, b, hcol=None):
    """Tree draft step ``j`` (1..k), standalone: write the draft KV of the rank-0 node at
    depth j-1 (the root for j = 1) at ``lens + j - 1``, then the ``topk`` candidates at
    depth j."""
    model, m = of(draft_kv).model(model), meta[:b]
    rows, pos = m[:, ROW], lens[:b] + (j - 1)
    prev = 0 if j == 1 else tree_node(j - 1, 0, topk)
    model.write_draft_kv(draft_kv, table, rows, pos, drafts[:b, prev], m[:, RID])
    c = model.draft(draft_kv, table, rows, pos + 1, m[:, SEED], m[:, SEEDED] == 1, topk=topk)
    drafts[:b, tree_node(j, 0, topk):tree_node(j + 1, 0, topk)] = tree_cut(model, m, lens[:b], c,
                                                                          hcol)


def tree_cut(model, m, lens, cands, hcol):
    """``round_tokens`` for a depth's candidates ([b, topk]), ungated."""
    if hcol is None:
        return cands
    return model.host_lens_cut(cands, lens[:, None], m[:, hcol, None])


@one_source
def tree_verify(model, kv, table, meta, drafts, lens, tgt, k, topk, b):
    """Target over the tree (``1 + k*topk`` nodes) under a tree mask: node i writes its KV
    at row position ``lens + i`` as the token at position ``lens + depth(i)``, and its
    query sees the committed prefix and its ancestors. The mask is a per-node view of the
    request's row: positions ``0..lens-1`` as they are, position ``lens + e`` read from the
    cell of the node's ancestor at depth e."""
    xp = of(kv)
    model, m = xp.model(model), meta[:b]
    parent, depth = tree_shape(k, topk, kv)
    path = tree_paths(parent, depth, k)                          # [n, k+1]
    n, w = parent.shape[0], table.shape[1]
    L = lens[:b].reshape(b, 1, 1)
    rel = xp.arange(w, kv).reshape(1, 1, w) - L                  # [b, 1, w]
    inpath = (rel >= 0) & (rel <= depth.reshape(1, n, 1))        # [b, n, w]
    anc = xp.gather(xp.expand(path[None], (b, n, k + 1)), 2,
                    xp.expand(xp.clamp(rel, 0, k), (b, n, w)))
    cols = xp.where(inpath, L + anc, rel + L)
    view = xp.gather(xp.expand(table[m[:, ROW]][:, None], (b, n, w)), 2, cols).reshape(b * n, w)
    q = xp.arange(b * n, kv)
    pos = (lens[:b, None] + depth[None, :]).reshape(-1)
    rid = xp.repeat_each(m[:, RID], n)
    model.write_kv(kv, view, q, pos, drafts[:b, :n].reshape(-1), rid)
    seeds = xp.repeat_each(m[:, SEED], n)
    seeded = xp.repeat_each(m[:, SEEDED] == 1, n)
    tgt[:b, :n] = model.target(kv, view, q, pos + 1, seeds, seeded).reshape(b, n)


@one_source
def tree_accept(drafts, tgt, out_tok, out_acc, path, chain, k, topk, b):
    """Greedy tree acceptance: from the root, step to the first child whose token equals
    the target's token at the current node, while one does; ``out_acc`` = nodes accepted
    past the root + 1 (the bonus). ``path[:, d]``: the accepted node at depth d (the last
    one past the accept length); ``out_tok[:, d]``: the target's token after it;
    ``chain[:, d]``: its token (the inputs the draft-extend writes)."""
    xp = of(drafts)
    parent, _ = tree_shape(k, topk, drafts)
    n = parent.shape[0]
    tok, t = drafts[:b, :n], tgt[:b, :n]
    cur = xp.zeros(b, drafts)
    acc = xp.ones_like(cur)
    alive = acc == 1
    nodes = xp.zeros((b, k + 1), drafts)
    for d in range(1, k + 1):
        want = xp.gather(t, 1, cur[:, None])
        hit = (parent[None, :] == cur[:, None]) & (tok == want) & alive[:, None]
        has = hit.any(1)
        cur = xp.where(has, xp.long(hit).argmax(1), cur)
        nodes[:, d] = cur
        acc = acc + xp.long(has)
        alive = alive & has
    out_acc[:b] = acc
    out_tok[:b, :k + 1] = xp.gather(t, 1, nodes)
    path[:b, :k + 1] = nodes
    chain[:b, :k + 1] = xp.gather(tok, 1, nodes)


@one_source
def tree_compact(kv, table, meta, lens, path, out_acc, k, b):
    """Move the accepted path's KV to contiguous positions: the node at depth d (row
    position ``lens + path[d]``) to ``lens + d``, for the accepted depths (SGLang's
    move of the accepted tokens' KV with topk > 1). Every source is read before any
    write."""
    xp, m = of(kv), meta[:b]
    rows = m[:, ROW, None]
    d = (xp.arange(k, kv) + 1)[None, :]
    L = lens[:b, None]
    src = table[rows, L + path[:b, 1:k + 1]]
    dst = table[rows, L + d]
    keep = d < out_acc[:b, None]
    kv[dst.reshape(-1)] = kv[xp.where(keep, src, dst).reshape(-1)]
