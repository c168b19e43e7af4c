"""The CPU twins of SGLang's Triton kernels against the kernels themselves, run by
Triton's interpreter on the same inputs (skipped where SGLang is missing).

Each case calls SGLang's own launch site twice on copies of one seeded input: once
interpreted, once with the twins installed; index and bookkeeping kernels must agree
exactly, attention to float rounding."""
import importlib

import pytest
import torch

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def sg():
    from overlapcheck.targets.sglang import SglangTarget, env
    from overlapcheck.protocol.target import TargetUnavailable
    try:
        SglangTarget().version()
    except TargetUnavailable as e:
        pytest.skip(str(e))
    mods = {}
    with env.stubbed():
        for name in ("attention.kv_indices", "speculative.gather_spec_extras",
                     "speculative.cache_locs", "speculative.eagle", "speculative.spec_tree",
                     "attention.position", "memory.common", "attention.decode_attention",
                     "attention.extend_attention"):
            mods[name.split(".")[1]] = importlib.import_module(f"sglang.kernels.ops.{name}")
    from triton.runtime.interpreter import InterpretedFunction
    assert isinstance(mods["eagle"].fill_bonus_tokens, InterpretedFunction), \
        "SGLang's kernels must be interpreted functions (TRITON_INTERPRET=1 at import)"
    return mods


def _both(fn, make):
    """``fn(*make())`` interpreted and with the twins; the two argument lists after."""
    from overlapcheck.targets.sglang import twins
    a, b = make(), make()
    fn(*a)
    with twins.installed() as n:
        fn(*b)
    assert sum(n.twin.values()) >= 1 and not n.interpreted, (dict(n.twin), dict(n.interpreted))
    return a, b


def _same(a, b):
    for x, y in zip(a, b):
        if isinstance(x, torch.Tensor):
            assert torch.equal(x, y), (x, y)


def _gen(seed):
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("page", [1, 4])
def test_create_kv_indices(sg, page):
    k = sg["kv_indices"].create_flashinfer_kv_indices_triton

    def make():
        g = _gen(1)
        table = torch.randint(0, 200, (6, 40), generator=g, dtype=torch.int32)
        rows = torch.tensor([4, 0, 2], dtype=torch.int64)
        lens = torch.tensor([7, 0, 13], dtype=torch.int32)
        indptr = torch.zeros(4, dtype=torch.int32)
        indptr[1:] = torch.cumsum(lens, 0)
        start = torch.tensor([1, 0, 3], dtype=torch.int32)
        out = torch.full((20,), -7, dtype=torch.int64)
        return table, rows, lens, indptr, start, out

    def run(table, rows, lens, indptr, start, out):
        k[(3,)](table, rows, lens, indptr, start, out, table.shape[1], ENTRY_PAGE_SIZE=page)

    a, b = _both(run, make)
    _same(a, b)


def test_gather_spec_extras(sg):
    f = sg["gather_spec_extras"].gather_spec_extras

    def make():
        g = _gen(2)
        return (torch.tensor([3, 0, 3, 5]), torch.rand(8, 2, generator=g),
                torch.randint(0, 50, (8, 2), generator=g), torch.randint(0, 50, (8,), generator=g),
                torch.rand(8, 6, generator=g))

    out = {}

    def run(*args):
        out.setdefault("r", []).append(f(*args))

    _both(run, make)
    for x, y in zip(*out["r"]):
        assert torch.equal(x, y)


def test_assign_draft_cache_locs(sg):
    f = sg["cache_locs"].assign_draft_cache_locs_contiguous_func

    def make():
        g = _gen(3)
        return (torch.tensor([2, 0, 5]), torch.randint(0, 300, (7, 30), generator=g, dtype=torch.int32),
                torch.tensor([4, 11, 0]), torch.full((3 * 2 * 3,), -1, dtype=torch.int64),
                torch.full((3 * 2,), -1, dtype=torch.int64))

    def run(rows, table, seq, out, pos):
        f(rows, table, seq, out, 2, 3, positions=pos)

    a, b = _both(run, make)
    _same(a, b)


@pytest.mark.parametrize("steps,bs,topk,page", [(2, 3, 1, 1), (3, 2, 2, 1), (3, 2, 2, 4)])
def test_draft_decode_kv_indices(sg, steps, bs, topk, page):
    k = sg["cache_locs"].generate_draft_decode_kv_indices
    lens = [5, 9, 3][:bs]

    def make():
        g = _gen(4)
        table = torch.randint(0, 300, (6, 40), generator=g, dtype=torch.int32)
        rows = torch.tensor([1, 4, 2][:bs])
        seq = torch.tensor(lens, dtype=torch.int32)
        width = (sum(lens) * topk + bs * topk * steps) * 1
        kv_indices = torch.full((steps, width + 8), -1, dtype=torch.int32)
        kv_indptr = torch.zeros((steps, bs * topk + 1), dtype=torch.int32)
        positions = torch.tensor([n for n in lens for _ in range(topk)], dtype=torch.int64)
        return rows, table, seq, kv_indices, kv_indptr, positions

    def run(rows, table, seq, kv_indices, kv_indptr, positions):
        k[(steps, bs, topk)](rows, table, seq, kv_indices, kv_indptr, positions,
                             table.shape[1], kv_indices.shape[1], kv_indptr.shape[1],
                             8, 8, 8, page)

    a, b = _both(run, make)
    _same(a, b)


def test_fill_bonus_tokens(sg):
    f = sg["eagle"].fill_bonus_tokens_func

    def make():
        g = _gen(5)
        return (torch.randint(0, 60, (4 * 3,), generator=g), torch.tensor([1, 3, 2, 1], dtype=torch.int32),
                torch.full((4,), -1, dtype=torch.int64))

    def run(tokens, lens, out):
        f(tokens, lens, out, 3, 4)

    a, b = _both(run, make)
    _same(a, b)


@pytest.mark.parametrize("topk,depth,mode", [(1, 3, 0), (2, 3, 0), (3, 2, 1), (1, 4, 1)])
def test_build_tree(sg, topk, depth, mode):
    st = sg["spec_tree"]
    bs, n = 3, (depth * topk if topk > 1 else depth) + 1
    if topk > 1:
        n = min(n, topk * depth)

    def make():
        g = _gen(6)
        parents = torch.randint(-1, topk * depth, (bs, topk * (depth - 1) + 1), generator=g)
        scores = topk + (depth - 1) * topk * topk       # the draft's flat score list
        sel = torch.sort(torch.stack([torch.randperm(scores, generator=g)[:n - 1]
                                      for _ in range(bs)]), dim=1).values
        seq = torch.tensor([5, 2, 7])
        mask_len = (bs * n * n) if mode else int(n * (seq.sum() + n * bs))
        return (parents, sel, seq, torch.full((mask_len,), True), torch.zeros(bs * n, dtype=torch.int64),
                torch.full((bs, n), -1), torch.full((bs, n), -1), torch.full((bs, n), -1))

    def run(*args):
        st.sgl_build_tree_kernel_triton(*args, topk, depth, n, st.TreeMaskMode(mode))

    a, b = _both(run, make)
    _same(a, b)


def test_verify_tree_greedy(sg):
    st = sg["spec_tree"]
    bs, n, spec = 3, 4, 4

    def make():
        g = _gen(7)
        ridx = torch.arange(bs * n).view(bs, n)
        nxt = torch.tensor([[1, 2, 3, -1], [1, -1, -1, -1], [1, 3, -1, -1]])
        sib = torch.tensor([[-1, -1, -1, -1], [-1, 2, 3, -1], [-1, 2, -1, -1]])
        cand = torch.randint(0, 3, (bs, n), generator=g)
        target = torch.randint(0, 3, (bs, n), generator=g)
        return (torch.full((bs * n,), -1), torch.full((bs, spec), -1), torch.zeros(bs, dtype=torch.int32),
                cand, ridx, nxt, sib, target)

    a, b = _both(st.verify_tree_greedy_triton, make)
    _same(a, b)


def test_compute_position(sg):
    f = sg["position"].compute_position_triton
    out = []

    def run(pre, lens):
        out.append(f(pre, lens, int(lens.sum())))

    _both(run, lambda: (torch.tensor([0, 5, 2], dtype=torch.int32), torch.tensor([3, 1, 4], dtype=torch.int32)))
    for x, y in zip(*out):
        assert torch.equal(x, y)


def test_write_req_to_token_pool(sg):
    k = sg["common"].write_req_to_token_pool_triton
    prefixes = [torch.tensor([9, 8, 7], dtype=torch.int64), torch.tensor([], dtype=torch.int64),
                torch.tensor([4], dtype=torch.int64)]

    def make():
        ptrs = torch.tensor([t.data_ptr() for t in prefixes], dtype=torch.uint64)
        return (torch.full((5, 12), -1, dtype=torch.int32), torch.tensor([3, 0, 1]), ptrs,
                torch.tensor([3, 0, 1]), torch.tensor([5, 2, 4]), torch.tensor([2, 2, 3]),
                torch.arange(100, 107))

    def run(table, rows, ptrs, pre, seq, ext, locs):
        k[(3,)](table, rows, ptrs, pre, seq, ext, locs, table.shape[1])

    a, b = _both(run, make)
    _same(a, b)


def test_get_last_loc(sg):
    f = sg["common"].get_last_loc_triton
    out = []

    def run(table, rows, pre):
        out.append(f(table, rows, pre))

    _both(run, lambda: (torch.arange(5 * 12, dtype=torch.int32).view(5, 12) * 3,
                        torch.tensor([3, 0, 1, 4]), torch.tensor([5, 0, 12, 1])))
    assert torch.equal(*out) and out[0][1] == -1, out


def _attention_inputs(g, heads=4, kvh=2, d=16, slots=40):
    return (torch.randn(slots, kvh, d, generator=g), torch.randn(slots, kvh, d, generator=g))


def test_decode_attention(sg):
    from overlapcheck.targets.sglang import twins
    f = sg["decode_attention"].decode_attention_fwd
    g = _gen(8)
    kb, vb = _attention_inputs(g)
    q = torch.randn(3, 4, 16, generator=g)
    lens = torch.tensor([5, 1, 9])
    indptr = torch.zeros(4, dtype=torch.int32)
    indptr[1:] = torch.cumsum(lens, 0)
    idx = torch.randperm(40, generator=g)[:15].to(torch.int32)
    splits = torch.tensor([2, 1, 4], dtype=torch.int32)
    logits = torch.empty(3, 4, 4, 16)
    lse = torch.empty(3, 4, 4)
    want, got = torch.zeros(3, 4, 16), torch.zeros(3, 4, 16)
    f(q, kb, vb, want, indptr, idx, logits, lse, splits, 4, 0.25, 1.0, 1.0)
    twins.decode_attention_fwd(q, kb, vb, got, indptr, idx, logits, lse, splits, 4, 0.25, 1.0, 1.0)
    assert torch.allclose(want, got, atol=1e-5), (want - got).abs().max()


@pytest.mark.parametrize("masked", [False, True])
def test_extend_attention(sg, masked):
    from overlapcheck.targets.sglang import twins
    f = sg["extend_attention"].extend_attention_fwd
    g = _gen(9)
    kb, vb = _attention_inputs(g)
    ext, pre = [3, 1, 4], [2, 0, 5]
    n = sum(ext)
    q, k, v = (torch.randn(n, h, 16, generator=g) for h in (4, 2, 2))
    qo = torch.tensor([0, 3, 4, 8], dtype=torch.int32)
    kvp = torch.tensor([0, 2, 2, 7], dtype=torch.int32)
    idx = torch.randperm(40, generator=g)[:7].to(torch.int32)
    mask = mask_indptr = None
    if masked:       # a tree mask: each new token sees the prefix, itself and some earlier ones
        rows = []
        for e, p in zip(ext, pre):
            m = torch.zeros(e, p + e, dtype=torch.bool)
            m[:, :p] = True
            for i in range(e):
                m[i, p + i] = True
                m[i, p:p + i] |= torch.rand(i, generator=g) < 0.5
            rows.append(m.flatten())
        mask = torch.cat(rows)
        mask_indptr = torch.tensor([0] + list(torch.cumsum(torch.tensor([r.numel() for r in rows]), 0)),
                                   dtype=torch.int64)
    want, got = torch.zeros(n, 4, 16), torch.zeros(n, 4, 16)
    args = (qo, kvp, idx, mask, not masked, mask_indptr, 4, 1.0, 1.0)
    f(q, k, v, want, kb, vb, *args)
    twins.extend_attention_fwd(q, k, v, got, kb, vb, *args)
    assert torch.allclose(want, got, atol=1e-5), (want - got).abs().max()


@pytest.mark.parametrize("masked,causal", [(False, True), (False, False), (True, True)])
def test_extend_attention_sliding_window(sg, masked, causal):
    """A window of 3 over window-trimmed prefixes (Gemma4's sliding layers): the
    prefix slots are the window's, and a custom mask (a tree verify's) is laid out
    over the whole context, read from each request's window offset on."""
    from overlapcheck.targets.sglang import twins
    f = sg["extend_attention"].extend_attention_fwd
    g = _gen(10)
    kb, vb = _attention_inputs(g)
    ext, pre, off = [3, 1, 4], [2, 0, 3], [4, 0, 1]     # window prefix, trimmed before it
    n = sum(ext)
    q, k, v = (torch.randn(n, h, 16, generator=g) for h in (4, 2, 2))
    qo = torch.tensor([0, 3, 4, 8], dtype=torch.int32)
    kvp = torch.tensor([0, 2, 2, 5], dtype=torch.int32)
    idx = torch.randperm(40, generator=g)[:5].to(torch.int64)
    mask = mask_indptr = offsets = None
    if masked:       # causal chains over the whole context, as a topk-1 verify builds them
        rows = []
        for e, p, o in zip(ext, pre, off):
            m = torch.zeros(e, o + p + e, dtype=torch.bool)
            m[:, :o + p] = True
            m[:, o + p:] = torch.ones(e, e, dtype=torch.bool).tril()
            rows.append(m.flatten())
        mask = torch.cat(rows)
        mask_indptr = torch.tensor([0] + list(torch.cumsum(torch.tensor([r.numel() for r in rows]), 0)),
                                   dtype=torch.int64)
        offsets = torch.tensor(off, dtype=torch.int64)
    want, got = torch.zeros(n, 4, 16), torch.zeros(n, 4, 16)
    args = (qo, kvp, idx, mask, causal, mask_indptr, 4, 1.0, 1.0)
    kw = dict(sliding_window_size=3, window_kv_offsets=offsets)
    f(q, k, v, want, kb, vb, *args, **kw)
    twins.extend_attention_fwd(q, k, v, got, kb, vb, *args, **kw)
    assert torch.allclose(want, got, atol=1e-5), (want - got).abs().max()
    if not masked:      # the window really cuts: without it the same launch differs
        whole = torch.zeros(n, 4, 16)
        twins.extend_attention_fwd(q, k, v, whole, kb, vb, *args)
        assert not torch.allclose(whole, got, atol=1e-3)


def test_extend_attention_scales_prefix_and_new_keys_as_the_kernel(sg):
    """k_scale and v_scale apply to the prefix (the cached KV) only."""
    from overlapcheck.targets.sglang import twins
    f = sg["extend_attention"].extend_attention_fwd
    g = _gen(11)
    kb, vb = _attention_inputs(g)
    q, k, v = (torch.randn(5, h, 16, generator=g) for h in (4, 2, 2))
    args = (torch.tensor([0, 5], dtype=torch.int32), torch.tensor([0, 6], dtype=torch.int32),
            torch.arange(6), None, True, None, 5, 0.5, 2.0)
    want, got = torch.zeros(5, 4, 16), torch.zeros(5, 4, 16)
    f(q, k, v, want, kb, vb, *args)
    twins.extend_attention_fwd(q, k, v, got, kb, vb, *args)
    assert torch.allclose(want, got, atol=1e-5), (want - got).abs().max()


@pytest.mark.parametrize("extras", [False, True])
def test_assign_extend_cache_locs_uniform(sg, extras):
    f = sg["cache_locs"].assign_extend_cache_locs_uniform

    def make():
        g = _gen(12)
        return (torch.tensor([2, 0, 5]), torch.randint(0, 300, (7, 30), generator=g, dtype=torch.int32),
                torch.tensor([4, 11, 0]), torch.full((3 * 4,), -1, dtype=torch.int64),
                torch.full((3, 4), -1, dtype=torch.int64), torch.tensor([7, 8, 9]),
                torch.full((3, 2), -1, dtype=torch.int64))

    def run(rows, table, start, out, pos, src, anchor):
        kw = dict(positions_out=pos, anchor_src=src, anchor_out=anchor,
                  anchor_stride=anchor.stride(0)) if extras else {}
        f[(3,)](rows, table, start, out, table.shape[1], 4, **kw)

    a, b = _both(run, make)
    _same(a, b)


def test_assign_extend_cache_locs(sg):
    f = sg["cache_locs"].assign_extend_cache_locs

    def make():
        g = _gen(13)
        return (torch.tensor([2, 0, 5]), torch.randint(0, 300, (7, 30), generator=g, dtype=torch.int32),
                torch.tensor([4, 11, 0]), torch.tensor([7, 11, 5]),
                torch.full((8,), -1, dtype=torch.int64))

    def run(rows, table, start, end, out):
        f[(3,)](rows, table, start, end, out, table.shape[1], 4)

    a, b = _both(run, make)
    _same(a, b)


def test_twins_declare_their_accesses_to_watch(sg):
    """Under watch, a twin is one kernel on the current stream reading its inputs and
    writing its outputs: a read on another stream with no edge is a race."""
    from overlapcheck.targets.sglang import twins
    from overlapcheck.watch import watch
    f = sg["eagle"].fill_bonus_tokens_func
    with watch(device="cpu", mode="log") as w:
        tokens = torch.arange(12, device="cuda")
        lens = torch.tensor([1, 3, 2, 1], dtype=torch.int32, device="cuda")
        bonus = torch.empty(4, dtype=torch.int64, device="cuda")
        side = torch.cuda.Stream()
        with twins.installed():
            f(tokens, lens, bonus, 3, 4)
        with torch.cuda.stream(side):
            bonus.add_(1)
    assert len(w.reports) == 1 and "fill_bonus_tokens" in str(w.reports[0])


def test_a_launch_that_stores_past_its_rows_is_refused_with_its_site(sg):
    """SGLang 0.5.23 sizes a draft step's kv_indices row num_seqs * topk * context; a
    request within num_steps of its context limit needs more. The interpreted kernel
    stores past the row (into the next step's, then past the buffer); the twin refuses
    the launch and names it."""
    from overlapcheck.targets.sglang import twins
    k = sg["cache_locs"].generate_draft_decode_kv_indices
    steps, ctx = 3, 8
    table = torch.arange(100, 100 + 3 * 16, dtype=torch.int32).view(3, 16)
    big = torch.full((steps * ctx + 8,), -1, dtype=torch.int64)
    args = lambda kv: (torch.tensor([2]), table, torch.tensor([ctx - 1], dtype=torch.int32), kv,  # noqa: E731
                       torch.zeros((steps, 2), dtype=torch.int32), torch.tensor([ctx - 1]),
                       table.shape[1], ctx, 2, 1, 4, 1, 1)
    k[(steps, 1, 1)](*args(big[:steps * ctx].view(steps, ctx)))
    assert big[steps * ctx:].tolist()[:2] == [140, 141]     # row 2, positions 8, 9: past the buffer
    with twins.installed(), pytest.raises(twins.KernelOutOfBounds) as e:
        k[(steps, 1, 1)](*args(torch.full((steps, ctx), -1, dtype=torch.int64)))
    assert "stores 10 entries in a draft step's kv_indices row of 8" in str(e.value)
