"""The HF decoder's Triton kernels on a CUDA device (skipped without one or without
Triton): bitwise batch invariant — a row alone equals the row in any batch, for the
kernels and for a whole model's logits — close to the exact path, and an engine
running them keeps parity and golden (whose references then run on the GPU too)."""
import pytest
import torch

from fake_models import make_model
from fake_models.hf import kernels, ops as O
from overlapcheck.engine import EngineConfig
from overlapcheck.protocol import generate
from overlapcheck.run import Case, ScheduleSpec, execute

pytestmark = pytest.mark.gpu
pytest.importorskip("triton")


@pytest.fixture(scope="module")
def T():
    if kernels.for_device("cuda") is O:
        pytest.skip("Triton cannot load here")
    return kernels.for_device("cuda")


def _chunks(f, x, n):
    return torch.cat([f(x[i:i + n]) for i in range(0, x.shape[0], n)])


@pytest.mark.parametrize("din,dout", [(64, 70), (2048, 8192), (8192, 2048), (1024, 151936)])
def test_linear_is_batch_invariant_and_close(T, din, dout):
    g = torch.Generator().manual_seed(din + dout)
    w = (torch.randn(din, dout, generator=g) * din ** -0.5).cuda()
    x = torch.randn(37, din, generator=g).cuda()
    W = T.prepare(w)
    y = T.linear(x, W)
    for n in (1, 3, 16, 17):
        assert torch.equal(_chunks(lambda t: T.linear(t, W), x, n), y), n
    ref = x.double() @ w.double()
    assert ((y.double() - ref).abs().max() / ref.abs().max()).item() < 2e-2


@pytest.mark.parametrize("kmajor", [False, True])
@pytest.mark.parametrize("bm,bn,bk,split", [(16, 32, 64, 1), (16, 64, 256, 1), (64, 64, 128, 1),
                                            (16, 64, 64, 3), (16, 32, 128, 2), (64, 64, 64, 8)])
def test_every_tile_layout_is_batch_invariant(T, kmajor, bm, bn, bk, split):
    """A tile ``bench/gpu_linear.py --sweep`` may pick: either weight layout, 16 or 64
    rows per program, the inputs in one range or split into ranges (the last one short
    or empty), with a residual, a bias and the folded norm, and the gated pair, rows
    alone equal rows in a batch, both layouts compute the same products, and a split
    sum is close to the unsplit one."""
    g = torch.Generator().manual_seed(bm + bn * bk + kmajor + 1000 * split)
    din, dout = 320, 200
    w, wu = ((torch.randn(din, dout, generator=g) * din ** -0.5).cuda() for _ in range(2))
    b, n = torch.randn(dout, generator=g).cuda(), (torch.rand(din, generator=g) + 0.5).cuda()
    x, r = torch.randn(21, din, generator=g).cuda(), torch.randn(21, dout, generator=g).cuda()
    tile = T.Tile(bn, bk, kmajor=kmajor, bm=bm, split=split)
    W, U = T.Bf16Weight(w, tile), T.Bf16Weight(wu, tile)
    assert torch.equal(W.dense.float(), w.to(torch.bfloat16).float())
    calls = (lambda t, rr: T.linear(t, W, b, residual=rr, norm=n, eps=1e-6),
             lambda t, rr: T.gated(t, W, U, norm=n, eps=1e-6))
    for f in calls:
        y = f(x, r)
        for k in (1, 5, 16):
            assert torch.equal(torch.cat([f(x[i:i + k], r[i:i + k])
                                          for i in range(0, 21, k)]), y), k
    other = T.Bf16Weight(w, T.Tile(bn, bk, kmajor=not kmajor, bm=bm, split=split))
    assert torch.allclose(T.linear(x, other), T.linear(x, W), rtol=0, atol=1e-5)
    whole = T.Bf16Weight(w, T.Tile(bn, bk, kmajor=kmajor, bm=bm))
    assert torch.allclose(T.linear(x, whole, b, residual=r), T.linear(x, W, b, residual=r),
                          rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("din,dout", [(8192, 2048), (2048, 8192), (3072, 1024), (2048, 1024)])
def test_rows_per_program_do_not_change_a_row(T, din, dout):
    """``Tile.rows`` picks 16 or 64 rows per program by the call's row count; that keeps
    the invariance only if a block product gives each row the same bits whatever rows
    share it: 16, 32 and 64 rows per program give bitwise the same outputs, split or
    not, through every epilogue; and the model's own tile, over ``WIDE_ROWS`` rows,
    equals its rows taken one at a time."""
    g = torch.Generator().manual_seed(din ^ dout)
    w, wu = ((torch.randn(din, dout, generator=g) * din ** -0.5).cuda() for _ in range(2))
    n = (torch.rand(din, generator=g) + 0.5).cuda()
    x, r = torch.randn(70, din, generator=g).cuda(), torch.randn(70, dout, generator=g).cuda()
    tile = T.tile_for(din, dout)
    for split in sorted({1, tile.split}):
        outs = []
        for bm in (16, 32, 64):
            t = T.Tile(tile.bn, tile.bk, kmajor=True, bm=bm, split=split)
            W, U = T.Bf16Weight(w, t), T.Bf16Weight(wu, t)
            outs.append((T.linear(x, W, residual=r), T.linear(x, W, norm=n, eps=1e-6),
                         T.gated(x, W, U, norm=n, eps=1e-6)))
        for other in outs[1:]:
            for a, b in zip(outs[0], other):
                assert torch.equal(a, b), split
    assert x.shape[0] > T.WIDE_ROWS      # the whole call takes the tile's wide_bm rows
    W, U = T.Bf16Weight(w), T.Bf16Weight(wu)
    for f in (lambda t, rr: T.linear(t, W, residual=rr), lambda t, rr: T.gated(t, W, U)):
        y = f(x, r)
        assert torch.equal(torch.cat([f(x[i:i + 1], r[i:i + 1]) for i in range(70)]), y)


def test_fused_epilogues_and_rope_are_batch_invariant_and_close(T):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(29, 1024, generator=g).cuda()
    wg, wu = (torch.randn(1024, 4096, generator=g) * 1024 ** -0.5 for _ in range(2))
    wg, wu = wg.cuda(), wu.cuda()
    b = torch.randn(4096, generator=g).cuda()
    r = torch.randn(29, 4096, generator=g).cuda()
    G, U = T.prepare(wg), T.prepare(wu)
    y = T.gated(x, G, U)
    z = T.linear(x, G, b, residual=r)
    for n in (1, 5, 16):
        assert torch.equal(_chunks(lambda t: T.gated(t, G, U), x, n), y), n
        assert torch.equal(torch.cat([T.linear(x[i:i + n], G, b, residual=r[i:i + n])
                                      for i in range(0, 29, n)]), z), n
    ref = torch.nn.functional.silu(x.double() @ wg.double()) * (x.double() @ wu.double())
    assert ((y.double() - ref).abs().max() / ref.abs().max()).item() < 3e-2
    assert torch.allclose(z, r + T.linear(x, G) + b, rtol=0, atol=1e-4)
    cos, sin = O.rope_tables(512, 64, 10000.0)
    q = torch.randn(9, 8, 64, generator=g).cuda()
    pos = torch.randint(0, 512, (9,), generator=g).cuda()
    rq = T.rope(q, pos, cos.cuda(), sin.cuda())
    assert torch.allclose(rq, O.rope(q, pos, cos.cuda(), sin.cuda()), rtol=1e-6, atol=1e-6)
    assert torch.equal(T.rope(q[3:4], pos[3:4], cos.cuda(), sin.cuda())[0], rq[3])


def test_rms_norm_and_attention_are_batch_invariant_and_close(T):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(33, 2048, generator=g).cuda()
    w = torch.rand(2048, generator=g).cuda()
    y = T.rms_norm(x, w, 1e-6)
    assert torch.equal(_chunks(lambda t: T.rms_norm(t, w, 1e-6), x, 1), y)
    assert torch.allclose(y, O.rms_norm(x, w, 1e-6), rtol=1e-5, atol=1e-5)
    n, heads, kvh, hd, slots_n = 12, 8, 2, 64, 400
    kv = torch.randn(slots_n, 3 + 2 * kvh * hd, generator=g).cuda()
    table = torch.stack([torch.randperm(slots_n - 1, generator=g)[:96] + 1 for _ in range(n)]).cuda()
    rows, pos = torch.arange(n).cuda(), torch.randint(0, 96, (n,), generator=g).cuda()
    q = torch.randn(n, heads, hd, generator=g).cuda()
    cols = (3, 3 + kvh * hd, 3 + 2 * kvh * hd)
    a = T.attend(q, kv, cols, *T.context_slots(table, rows, pos), kvh)
    for i in range(n):
        one = T.attend(q[i:i + 1], kv, cols, *T.context_slots(table, rows[i:i + 1], pos[i:i + 1]), kvh)
        assert torch.equal(one[0], a[i]), i
    wide = torch.cat([table, torch.zeros_like(table)], 1)      # a wider table: the same bits
    assert torch.equal(T.attend(q, kv, cols, *T.context_slots(wide, rows, pos), kvh), a)
    slots, mask = O.context_slots(table, rows, pos)
    assert torch.allclose(a, O.attend(q, kv, cols, slots, mask, kvh), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("qk_norm,bias", [(False, False), (True, False), (False, True)])
def test_norms_folded_into_matmuls_are_batch_invariant_and_close(T, qk_norm, bias):
    """The input norm in the Q|K|V matmul's prologue, the Q and K heads' norms and RoPE in
    one kernel, the post-attention norm in the gated MLP's prologue: a row alone equals
    the row in any batch, and each is close to the unfused kernels."""
    g = torch.Generator().manual_seed(11)
    d, H, KV, hd, t = 1024, 16, 4, 64, 21

    def w(i, o):
        return T.prepare((torch.randn(i, o, generator=g) * i ** -0.5).cuda())

    def vec(n, on):
        return (torch.rand(n, generator=g) + 0.5).cuda() if on else None

    L = T.layer_weights({"wq": w(d, H * hd), "wk": w(d, KV * hd), "wv": w(d, KV * hd),
                         "ln1": vec(d, True), "bq": vec(H * hd, bias), "bk": vec(KV * hd, bias),
                         "bv": vec(KV * hd, bias), "qn": vec(hd, qk_norm), "kn": vec(hd, qk_norm)})
    h = torch.randn(t, d, generator=g).cuda()
    pos = torch.randint(0, 512, (t,), generator=g).cuda()
    cos, sin = (x.cuda() for x in O.rope_tables(512, hd, 10000.0))
    q, kv = T.attention_inputs(h, L, 1e-6, H, KV, hd, pos, cos, sin)
    assert torch.equal(T.attention_inputs(h, L, 1e-6, H, KV, hd, pos, cos, sin, False)[1], kv)
    assert torch.equal(T.query(h, L, 1e-6, H, hd, pos, cos, sin), q)
    for i in (0, 7, 20):
        qa, kva = T.attention_inputs(h[i:i + 1], L, 1e-6, H, KV, hd, pos[i:i + 1], cos, sin)
        assert torch.equal(qa[0], q[i]) and torch.equal(kva[0], kv[i]), i
    for want_q in (True, False):      # the KV store in the same kernel: the same rows
        buf = torch.full((64, 7 + 2 * KV * hd + 5), -1.0).cuda()
        slots = torch.randperm(64, generator=g)[:t].cuda()
        qs, none = T.attention_inputs(h, L, 1e-6, H, KV, hd, pos, cos, sin, want_q,
                                      store=(buf, slots, 7))
        assert none is None and (not want_q or torch.equal(qs, q))
        assert torch.equal(buf[slots, 7:7 + 2 * KV * hd], kv)
        untouched = torch.ones(64, dtype=torch.bool, device="cuda")
        untouched[slots] = False
        assert (buf[untouched] == -1).all() and (buf[slots, :7] == -1).all()
        assert (buf[slots, 7 + 2 * KV * hd:] == -1).all()
    x = T.rms_norm(h, L["ln1"], 1e-6)
    q0 = T.heads(x, L["wq"], L["bq"], L["qn"], H, hd, 1e-6, pos, cos, sin)
    kv0 = T.kv_rows(x, L, KV, hd, 1e-6, pos, cos, sin)
    assert (q - q0).abs().max() / q0.abs().max() < 2e-2
    assert (kv - kv0).abs().max() / kv0.abs().max() < 2e-2
    wg, wu, ln = w(d, 4096), w(d, 4096), vec(d, True)
    y = T.norm_gated(h, ln, 1e-6, wg, wu)
    assert torch.equal(_chunks(lambda r: T.norm_gated(r, ln, 1e-6, wg, wu), h, 5), y)
    y0 = T.gated(T.rms_norm(h, ln, 1e-6), wg, wu)
    assert (y - y0).abs().max() / y0.abs().max() < 3e-2


def test_sampling_tail_in_one_kernel_equals_the_exact_paths(T):
    """The seeded sampling's integer tail (one Triton kernel) gives the exact path's
    tokens, negative seeds included."""
    g = torch.Generator().manual_seed(13)
    for n, vocab in ((1, 50), (37, 1000), (300, 151936)):
        logits = torch.randn(n, vocab, generator=g).cuda()
        seeds = torch.randint(-2 ** 62, 2 ** 62, (n,), generator=g).cuda()
        pos = torch.randint(0, 4000, (n,), generator=g).cuda()
        on = (torch.rand(n, generator=g) < 0.7).cuda()
        assert torch.equal(T.sample(logits, seeds, pos, on, vocab, 30, 2147483647),
                           O.sample(logits, seeds, pos, on, vocab, 30, 2147483647)), (n, vocab)


def test_greedy_token_is_argmax_first_column_in_any_shape(T):
    """The two-kernel greedy token is ``argmax``'s: the first column of the row's largest
    logit (many ties here, across and within the argmax's blocks), for logits of any
    leading shape, rows alone as in a batch."""
    g = torch.Generator().manual_seed(17)
    for shape, vocab in (((1,), 70), ((5, 3), 4096), ((2, 4), 4097), ((37,), 151936)):
        logits = torch.randint(0, 3, (*shape, vocab), generator=g).float().cuda()
        zero = torch.zeros(shape, dtype=torch.int64, device="cuda")
        off = torch.zeros(shape, dtype=torch.bool, device="cuda")
        got = T.sample(logits, zero, zero, off, vocab, 30, 2147483647)
        assert got.shape == shape
        assert torch.equal(got, logits.argmax(-1)), (shape, vocab)
        flat = logits.reshape(-1, vocab)
        alone = torch.cat([T.sample(flat[i:i + 1], zero.reshape(-1)[:1], zero.reshape(-1)[:1],
                                    off.reshape(-1)[:1], vocab, 30, 2147483647)
                           for i in range(flat.shape[0])])
        assert torch.equal(alone, got.reshape(-1))


@pytest.mark.parametrize("name", ["random:tiny-qwen3", "trained", "random:llama-1b"])
def test_model_logits_of_a_request_alone_equal_its_logits_in_a_batch(name):
    """Eight requests of different lengths written and read in one batch give the same
    KV rows and logits, bit for bit, as each written and read alone."""
    m = make_model(name)
    assert not m.exact_on("cuda")
    g = torch.Generator().manual_seed(3)
    lens = [5, 17, 1, 30, 9, 22, 2, 12]
    width = 32
    kvb = torch.zeros(len(lens) * width + 1, m.kv_width, device="cuda")
    table = (torch.arange(len(lens) * width).reshape(len(lens), width) + 1).cuda()
    toks = [torch.randint(0, m.vocab, (n,), generator=g) for n in lens]
    rows = torch.cat([torch.full((n,), r) for r, n in enumerate(lens)]).cuda()
    pos = torch.cat([torch.arange(n) for n in lens]).cuda()
    m.write_kv(kvb, table, rows, pos, torch.cat(toks).cuda(), rows.clone())
    ctx = torch.tensor(lens).cuda()
    batch = m.target_logits(kvb, table, torch.arange(len(lens)).cuda(), ctx)
    for r, n in enumerate(lens):
        kv1 = torch.zeros_like(kvb)
        one = torch.full((n,), r).cuda()
        m.write_kv(kv1, table, one, torch.arange(n).cuda(), toks[r].cuda(), one.clone())
        sl = table[r, :n]
        assert torch.equal(kv1[sl], kvb[sl]), f"{name}: request {r}'s KV rows differ"
        alone = m.target_logits(kv1, table, torch.tensor([r]).cuda(), ctx[r:r + 1])
        assert torch.equal(alone[0], batch[r]), f"{name}: request {r}'s logits differ"


@pytest.mark.parametrize("model", ["random:tiny-qwen3", "trained"])
@pytest.mark.parametrize("kind", ["standalone", "eagle", "mtp"])
def test_engine_on_triton_kernels_keeps_parity_and_golden(model, kind):
    cfg = EngineConfig(page_size=4, pool_tokens=512, row_width=64, max_running=6, chunk_size=16,
                       draft_kind=kind, model=model)
    for seed in (1, 2):
        wl = generate(seed, 8, cfg, max_new=20)
        out = execute(Case(cfg, wl, ScheduleSpec("random", seed)), device="cuda", trace=False)
        assert out.status == "completed", out.status
        assert not out.findings, out.findings[0].text
        assert out.result.summary.verifies > 0


def _model_outputs(m, lens, seed=5):
    """KV rows and logits of requests of ``lens`` written and read in one batch."""
    g = torch.Generator().manual_seed(seed)
    width = 32
    kvb = torch.zeros(len(lens) * width + 1, m.kv_width, device="cuda")
    table = (torch.arange(len(lens) * width).reshape(len(lens), width) + 1).cuda()
    toks = torch.cat([torch.randint(0, m.vocab, (n,), generator=g) for n in lens]).cuda()
    rows = torch.cat([torch.full((n,), r) for r, n in enumerate(lens)]).cuda()
    pos = torch.cat([torch.arange(n) for n in lens]).cuda()
    ctx = torch.tensor(lens).cuda()
    which = torch.arange(len(lens)).cuda()

    def forward():
        kvb.zero_()
        m.write_kv(kvb, table, rows, pos, toks, rows.clone())
        return m.target_logits(kvb, table, which, ctx)
    return kvb, forward


def test_dependent_launches_change_no_bit(T):
    """Programmatic dependent launch (on by default on cards of compute capability 9 and
    up) lets a kernel's programs wait on the card for the kernel before it: a model's KV
    rows and logits with it, eager and replayed from a CUDA graph, equal those of plain
    launches bit for bit; on such a card the compiled kernels do wait."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("no programmatic dependent launch before compute capability 9")
    m = make_model("random:tiny-qwen3")
    lens = [5, 17, 1, 30, 9, 22, 2, 12]
    was = T.pdl()
    try:
        T.set_pdl(False)
        kv, forward = _model_outputs(m, lens)
        plain = forward().clone()
        plain_kv = kv.clone()
        T.set_pdl(True)
        eager = forward().clone()
        assert torch.equal(kv, plain_kv) and torch.equal(eager, plain)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            forward()                        # compiled and warm before the capture
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = forward()
        for _ in range(3):
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(kv, plain_kv) and torch.equal(out, plain)
        x = torch.randn(3, 64, device="cuda")
        k = T._rms_kernel[(3,)](x, torch.ones(64, device="cuda"), torch.empty_like(x), 3, 64,
                                1e-6, BLOCK=64, **T._gdc())
        assert "griddepcontrol.wait" in k.asm["ptx"]
    finally:
        T.set_pdl(was)
