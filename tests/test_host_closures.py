"""The sim's host runs of the device kernels (each kernel's one source on numpy views,
device/xp.py, calling the oracle's host mirror, fake_models/oracle_host.py) give exactly
what the kernels give on torch: the same writes and refusals on random inputs, and the
same runs, digests, decisions and findings with the host runs on and off, on every
draft kind, oracle variant and engine mode (a host run that fails is judged against its
kernel: test_twin_check.py)."""
import numpy as np
import pytest
import torch

from fake_models.kv_store import kept_sources as kept_torch
from fake_models.oracle_host import kept_sources as kept_host
from overlapcheck.device import make_runtime
from overlapcheck.engine import EngineConfig
from overlapcheck.protocol import generate
from overlapcheck.run import Case, ScheduleSpec, execute

from engine_checks import ENGINE_MODES, twins_agree

pytestmark = pytest.mark.usefixtures("one_thread")

MODES = {
    **ENGINE_MODES,
    "pages-of-4": {"page_size": 4, "pool_tokens": 192},
    "tight-pool": {"pool_tokens": 96, "max_running": 4},
}


_same = twins_agree


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("kind", ["standalone", "eagle", "mtp"])
@pytest.mark.parametrize("model", ["oracle", "oracle-hostlens"])
def test_twins_give_the_kernels_runs(mode, kind, model):
    cfg = EngineConfig(**{"row_width": 48, "pool_tokens": 256, "draft_kind": kind,
                          "model": model, **MODES[mode]})
    wl = generate(3, 6, cfg, max_prompt=12, max_new=16)
    out = _same(Case(cfg, wl, ScheduleSpec("random", 5)))
    assert out.status == "completed" and not out.findings


TREE_MODES = {"overlap": {}, "no-overlap": {"overlap": False}, "kv-backup": {"kv_backup": True},
              "ring": {"future_map": "ring"}, "tight-pool": {"pool_tokens": 128, "max_running": 4}}


@pytest.mark.parametrize("mode", sorted(TREE_MODES))
@pytest.mark.parametrize("kind", ["standalone", "eagle"])
@pytest.mark.parametrize("model", ["oracle", "oracle-hostlens"])
def test_twins_give_the_kernels_tree_runs(mode, kind, model):
    cfg = EngineConfig(**{"row_width": 48, "pool_tokens": 256, "draft_kind": kind, "topk": 3,
                          "spec_steps": 3, "model": model, **TREE_MODES[mode]})
    wl = generate(3, 6, cfg, max_prompt=12, max_new=16)
    out = _same(Case(cfg, wl, ScheduleSpec("random", 5)))
    assert out.status == "completed" and not out.findings


def test_tree_kernels_run_on_the_host():
    """The tree kernels' host runs (a twin, or the kernel's one source on numpy views)
    run and none falls back to its torch kernel: a host run that always failed would
    pass the agreement tests above on the kernels alone."""
    names = ("tree_draft_step", "tree_verify", "tree_accept", "tree_compact",
             "tree_eagle_resolve", "tree_eagle_step", "eagle_extend", "eagle_prefill")
    ran, real = [], {}
    for name in names:
        kernel = _kernel(name)
        fn = real[kernel] = kernel.host_run

        def spy(*a, _fn=fn, _name=name, **k):
            out = _fn(*a, **k)
            ran.append(_name)
            return out
        kernel.host_run = spy
    try:
        for kind in ("standalone", "eagle"):
            cfg = EngineConfig(row_width=48, pool_tokens=256, draft_kind=kind, topk=2,
                               spec_steps=3)
            wl = generate(2, 4, cfg, max_prompt=12, max_new=12)
            rt = make_runtime("sim", strategy="eager", access="declared")
            assert execute(Case(cfg, wl, ScheduleSpec("random", 1)), runtime=rt).status == \
                "completed"
    finally:
        for kernel, fn in real.items():
            kernel.host_run = fn
    assert set(ran) == set(names)


def _kernel(name):
    from overlapcheck.engine import backup_check, canary, drafts_eagle, drafts_mtp, kernels
    for mod in (kernels, drafts_eagle, drafts_mtp, canary, backup_check):
        if callable(getattr(mod, name, None)):
            return getattr(mod, name)
    raise LookupError(name)


@pytest.mark.parametrize("fault", ["no-copy-done-wait", "single-staging-buffer",
                                   "eagle-stash-batch-position", "mtp-draft-reads-unfrozen-kv"])
def test_twins_give_the_kernels_findings_on_stale_data(fault):
    kind = {"eagle-stash-batch-position": "eagle",
            "mtp-draft-reads-unfrozen-kv": "mtp"}.get(fault, "standalone")
    cfg = EngineConfig(row_width=48, pool_tokens=256, draft_kind=kind)
    wl = generate(4, 6, cfg, max_prompt=12, max_new=16)
    lag = ScheduleSpec("stalls", 0, (("forward", 0, 10 ** 9),))
    found = [_same(Case(cfg, wl, s, faults=(fault,))).findings
             for s in (lag, ScheduleSpec("random", 1))]
    assert any(found)


def test_kept_sources_twin_matches_torch():
    rng = np.random.default_rng(0)
    for _ in range(500):
        n, slots = int(rng.integers(0, 24)), int(rng.integers(1, 10))
        s, keep = rng.integers(0, slots, n), rng.random(n) < 0.5
        want = kept_torch(slots, torch.from_numpy(s), torch.from_numpy(keep)).numpy()
        assert (kept_host(slots, s, keep) == want).all()


def test_twins_run_only_where_nothing_intercepts():
    rt = make_runtime("sim", strategy="eager", access="infer")
    calls = []

    def kernel(t):
        calls.append("kernel")
        t.add_(1)

    kernel.host_run = lambda a: calls.append("twin")
    s = rt.new_stream("s")
    buf = rt.empty((4,), torch.int64, "x", s)
    rt.launch(s, kernel, buf.t, name="k", writes=[buf])
    rt.synchronize()
    assert calls == ["kernel"]


def _oracle_inputs(rng, q, extreme):
    """A KV pool, a table and ``q`` queries; ``extreme``: lengths, positions and seeds
    anywhere in int64 (poison values a stale read gives), tokens too."""
    kv = rng.integers(0, 64, (40, 4))
    if extreme:
        kv[rng.random(kv.shape) < 0.2] = rng.integers(-2 ** 62, 2 ** 62, 1)
    table = rng.integers(0, 40, (6, 16))
    rows = rng.integers(0, 6, q)
    lens = rng.integers(0, 18, q)
    seeds = rng.integers(-2 ** 63, 2 ** 63 - 1, q, dtype=np.int64)
    if extreme:
        seeds[: q // 2] = rng.integers(-5, 5, q // 2)
    return kv, table, rows, lens, seeds, rng.random(q) < 0.5


@pytest.mark.parametrize("extreme", [False, True])
def test_oracle_twin_chains_match_torch(extreme):
    """The oracle twin's per-query chains (Python ints up to ``_TINY`` queries, arrays
    past it) give the torch model's tokens, poison operands included."""
    from fake_models.oracle import OracleModel
    rng = np.random.default_rng(7)
    for salt in (0, 5):
        model = OracleModel(vocab=50, agreement=60, salt=salt)
        hm, eagle, mtp = model.host, model.head("eagle"), model.head("mtp")
        for q in (0, 1, 3, 16, 17, 40):
            kv, table, rows, lens, seeds, seeded = _oracle_inputs(rng, q, extreme)
            t = {k: torch.from_numpy(v) for k, v in
                 dict(kv=kv, table=table, rows=rows, lens=lens, seeds=seeds,
                      seeded=seeded).items()}
            pos = rng.integers(0, 15, q)
            tpos = torch.from_numpy(pos)
            want = model.target(t["kv"], t["table"], t["rows"], t["lens"], t["seeds"],
                                t["seeded"])
            assert (hm.target(kv, table, rows, lens, seeds, seeded) == want.numpy()).all()
            for topk in (1, 3):
                want = model.draft(t["kv"], t["table"], t["rows"], t["lens"], t["seeds"],
                                   t["seeded"], topk=topk)
                got = hm.draft(kv, table, rows, lens, seeds, seeded, topk=topk)
                assert (got == want.numpy()).all()
                g, d = eagle.out(t["kv"], t["table"], t["rows"], tpos, t["seeds"],
                                 t["seeded"], **({"topk": topk} if topk > 1 else {}))
                hg, hd = hm.eagle_out(kv, table, rows, pos, seeds, seeded, topk)
                assert (hg == g.numpy()).all() and (hd == d.numpy()).all()
            feats = kv[rng.integers(0, 40, q)][:, 3:]
            toks = kv[rng.integers(0, 40, q), 0]
            g, d = mtp.step(t["kv"][:, :3], t["table"], t["rows"], t["lens"], tpos,
                            torch.from_numpy(toks), torch.from_numpy(feats), t["seeds"],
                            t["seeded"])
            hg, hd = hm.mtp_step(kv[:, :3], table, rows, lens, pos, toks, feats, seeds, seeded)
            assert (hg == g.numpy()).all() and (hd == d.numpy()).all()


def test_oracle_twin_hashes_of_one_query_match_torch():
    """The hashes' one-query path (``_one_query``) gives the torch hash, and raises where
    torch's gather refuses a slot: lengths below 0 and past the table, slots that wrap
    (negative) or fall outside the pool."""
    from fake_models import oracle_host as H
    from fake_models.oracle import OracleModel
    from fake_models.oracle_heads import _hash_columns
    rng = np.random.default_rng(3)
    for _ in range(400):
        kv = rng.integers(-2 ** 40, 2 ** 40, (int(rng.integers(1, 12)), 3))
        table = rng.integers(-14, 14, (3, int(rng.integers(1, 9))))
        rows, ctx = rng.integers(-3, 3, 1), rng.integers(-2, 11, 1)
        cols = (0, 2) if rng.random() < 0.5 else (1,)
        t = [torch.from_numpy(a) for a in (kv, table, rows, ctx)]
        for host, ref in ((lambda: H.raw_hash(kv, table, rows, ctx),
                           lambda: OracleModel.raw_hash(*t)),
                          (lambda: H.hash_columns(kv, table, rows, ctx, cols),
                           lambda: _hash_columns(*t, cols))):
            try:
                want = ref().numpy()
            except (IndexError, RuntimeError):
                with pytest.raises(IndexError):
                    host()
                continue
            got = host()
            assert got.dtype == want.dtype and got.shape == want.shape and (got == want).all()


def test_remembered_hashes_are_the_hashes_of_the_values_read(monkeypatch):
    """The hash memo (``oracle_host._MEMO``) hands back what the hash computes now:
    after the KV a row reads changes in place, for other arrays holding the same values
    (hits), for other dtypes, and when it is emptied while full; one-query raw hashes
    agree with the torch hash."""
    from fake_models import oracle_host as H
    from fake_models.oracle import OracleModel
    monkeypatch.setattr(H, "_MEMO_CAP", 64)
    H._MEMO.clear()
    rng = np.random.default_rng(11)
    pools = [rng.integers(0, 3, (6, 4)) for _ in range(3)]
    hits = 0
    for _ in range(1500):
        kv = pools[int(rng.integers(3))].copy()   # few pools: the same rows come back
        u = rng.random()
        if u < 0.1:
            kv = kv.astype(np.int32)
        elif u < 0.2:
            kv = kv.view(np.float64)              # the same bytes as another dtype
        width = int(rng.integers(1, 5))
        table = rng.integers(0, 6, (2, width))
        row, ctx = int(rng.integers(0, 2)), int(rng.integers(0, width + 2))
        before = len(H._MEMO)
        one = H.raw_hash_one(kv, table, row, ctx)
        hits += len(H._MEMO) == before
        kept = dict(H._MEMO)
        H._MEMO.clear()
        assert one == H.raw_hash_one(kv, table, row, ctx)      # computed afresh
        H._MEMO.update(kept)
        if kv.dtype == np.int64:
            want = OracleModel.raw_hash(torch.from_numpy(kv), torch.from_numpy(table),
                                        torch.tensor([row]), torch.tensor([ctx]))
            assert one == int(want[0])
        kv[table[row, :1]] += 1                   # the same array, other values
        again = H.raw_hash_one(kv, table, row, ctx)
        H._MEMO.clear()
        assert again == H.raw_hash_one(kv, table, row, ctx)
    assert hits > 50 and len(H._MEMO) <= 64


@pytest.mark.parametrize("b", [1, 2, 3, 5])
def test_canary_on_numpy_matches_torch(b):
    """The canary on numpy views (the sim's host run of its one source) writes the
    record it writes on torch: tags wrong or missing, slots out of the pool or negative,
    lengths below 0 or past the table, a prefix column, another tag order, a clean KV;
    and raises where the kernel's gathers refuse."""
    from overlapcheck.engine import canary as C
    from overlapcheck.engine.kernels import N, RID, ROW, START
    from overlapcheck.protocol.canary import C_BAD, CANARY
    rng = np.random.default_rng(11)
    checked = clean = 0
    for _ in range(300):
        pool, width = int(rng.integers(1, 10)), int(rng.integers(1, 8))
        kv = np.stack([rng.integers(0, 5, pool), rng.integers(0, width, pool),
                       rng.integers(0, 3, pool)], 1)
        if rng.random() < 0.3:
            kv[rng.random(kv.shape) < 0.3] = -2 ** 62
        table = rng.integers(-2, pool + 2, (3, width))
        consistent = rng.random() < 0.5
        if consistent:              # a KV that row 0 reads as written: the clean case
            pool = max(pool, width)
            table[0] = rng.permutation(pool)[:width]
            kv = np.stack([rng.integers(0, 5, pool), rng.integers(0, width, pool),
                           np.full(pool, 1)], 1)
            kv[table[0], 1] = np.arange(width)
            if rng.random() < 0.2:
                kv[table[0][rng.integers(0, width)], rng.integers(0, 3)] = 4
        meta = rng.integers(0, 3, (b + 1, 16))
        meta[:, ROW] = rng.integers(-3, 4, b + 1) if not consistent else 0
        if consistent:
            meta[:, RID] = 1 if rng.random() < 0.9 else 2
        meta[:, START], meta[:, N] = rng.integers(-3, width, b + 1), rng.integers(0, 4, b + 1)
        lens = rng.integers(-2, width + 3, b + 1)
        tags = (0, 1, 2) if rng.random() < 0.5 else (2, 0, 1)
        prefill, pfx = bool(rng.random() < 0.5), (5 if rng.random() < 0.5 else None)
        meta[:, 5] = rng.integers(0, width, b + 1)
        want = np.full((b + 1, CANARY), 7, dtype=np.int64)
        got = want.copy()
        t = [torch.from_numpy(a) for a in (kv, table, meta, lens, want)]
        try:
            C.canary(*t, tags, b, prefill, pfx)
        except (IndexError, RuntimeError):
            with pytest.raises(IndexError):
                C.canary(kv, table, meta, lens, got, tags, b, prefill, pfx)
            continue
        C.canary(kv, table, meta, lens, got, tags, b, prefill, pfx)
        assert (got == want).all(), (got, want)
        checked += 1
        clean += not got[:b, C_BAD].any()
    assert checked > 100 and clean > 10


@pytest.mark.parametrize("b", [1, 2])
def test_prefill_finish_on_numpy_matches_torch(b):
    """prefill_finish on numpy views writes what it writes on torch, into the
    row-indexed FutureMap or a ring slot, sampled or not, last chunk or not, lengths
    that wrap around; and raises where the kernel's gathers refuse a slot."""
    from fake_models.oracle import OracleModel
    from overlapcheck.engine import kernels as K
    model = OracleModel(vocab=50, agreement=60, salt=0)
    rng = np.random.default_rng(5)
    checked = 0
    for _ in range(300):
        kv, table, *_ = _oracle_inputs(rng, 0, rng.random() < 0.5)
        meta = rng.integers(0, 2, (b + 1, 16))
        meta[:, K.ROW] = rng.integers(0, 6, b + 1)
        meta[:, K.START], meta[:, K.N] = rng.integers(0, 12, b + 1), rng.integers(1, 6, b + 1)
        if rng.random() < 0.2:      # poison lengths: their sum wraps around in int64
            meta[:, K.START], meta[:, K.N] = 2 ** 62 + 5, 2 ** 62 + rng.integers(0, 9, b + 1)
        meta[:, K.SEED], meta[:, K.NEXT] = rng.integers(-9, 9, b + 1), rng.integers(0, 50, b + 1)
        meta[:, K.FDST] = rng.integers(-2, 8, b + 1)
        dst = K.ROW if rng.random() < 0.5 else K.FDST
        fm = [rng.integers(0, 50, 6), rng.integers(0, 50, 6)]
        outs = [rng.integers(0, 9, (b + 1, 3)), rng.integers(0, 9, b + 1)]
        want = [a.copy() for a in fm + outs]
        got = [a.copy() for a in fm + outs]
        t = [torch.from_numpy(a) for a in want]
        try:
            K.prefill_finish(model, torch.from_numpy(kv), torch.from_numpy(table), t[0], t[1],
                             torch.from_numpy(meta), t[2], t[3], b, dst)
        except (IndexError, RuntimeError):
            with pytest.raises(IndexError):
                K.prefill_finish(model, kv, table, got[0], got[1], meta, got[2], got[3], b, dst)
            continue
        K.prefill_finish(model, kv, table, got[0], got[1], meta, got[2], got[3], b, dst)
        assert all((g == w).all() for g, w in zip(got, want))
        checked += 1
    assert checked > 100


def test_prefill_write_on_numpy_matches_torch():
    """prefill_write on numpy views (the sim's host run of its one source) stores what
    it stores on torch in the target and draft pools: duplicate slots (the last writer
    wins), negative slots, a draft pool smaller than the target's; and raises where the
    kernel's gather or scatter refuses an index, having written nothing the kernel, run
    next from the start on torch, does not write the same way."""
    from fake_models.oracle import OracleModel
    from overlapcheck.engine import kernels as K
    model = OracleModel(vocab=50, agreement=60, salt=0)
    rng = np.random.default_rng(9)
    checked = raised = 0
    for _ in range(400):
        pool = int(rng.integers(2, 12))
        table = rng.integers(-2, pool + 2, (3, 6))
        n = int(rng.integers(0, 12))
        ptok = np.stack([rng.integers(-1, 4, 12), rng.integers(-1, 7, 12),
                         rng.integers(0, 50, 12), rng.integers(0, 3, 12)], 1)
        kv = rng.integers(0, 9, (pool, 3))
        draft = rng.integers(0, 9, (int(rng.integers(1, pool + 1)), 3)) if rng.random() < 0.5 else None
        want = [kv.copy(), None if draft is None else draft.copy()]
        got = [kv.copy(), None if draft is None else draft.copy()]
        t = [torch.from_numpy(a) if a is not None else None for a in want]
        try:
            K.prefill_write(model, t[0], t[1], torch.from_numpy(table), torch.from_numpy(ptok), n)
            ok = True
        except (IndexError, RuntimeError):
            ok = False
        if ok:
            K.prefill_write(model, got[0], got[1], table, ptok, n)
            checked += 1
        else:     # the runtime then runs the kernel from the start, over the host run's writes
            with pytest.raises(IndexError):
                K.prefill_write(model, got[0], got[1], table, ptok, n)
            g = [torch.from_numpy(a) if a is not None else None for a in got]
            with pytest.raises((IndexError, RuntimeError)):
                K.prefill_write(model, g[0], g[1], torch.from_numpy(table),
                                torch.from_numpy(ptok), n)
            raised += 1
        assert all(g is None or (g == w).all() for g, w in zip(got, want))
    assert checked > 40 and raised > 40


def _few_inputs(rng, b, width):
    """A model kernel's inputs for ``b`` entries (one spare row each), ``width``
    positions: mostly in range (the twins' Python-int paths), else a row, length or
    slot out of range, negative or poison (the array path, which reports or wraps them
    as torch does); entries share table rows, so their writes can share slots."""
    from overlapcheck.engine import kernels as K
    pool, w = int(rng.integers(1, 24)), int(rng.integers(width + 1, width + 12))
    odd = rng.random() < 0.25
    kv, ekv = rng.integers(0, 64, (pool, 3)), rng.integers(0, 64, (pool, 4))
    if rng.random() < 0.3:
        for a in (kv, ekv):
            a[rng.random(a.shape) < 0.2] = rng.choice([-2 ** 62, 2 ** 62, 2 ** 63 - 1])
    table = rng.integers(0, pool, (3, w))
    meta = rng.integers(0, 2, (b + 1, K.META + 2))
    meta[:, K.ROW], meta[:, K.RID] = rng.integers(0, 3, b + 1), rng.integers(0, 5, b + 1)
    meta[:, K.SEED] = rng.integers(-9, 9, b + 1) if rng.random() < 0.5 else \
        rng.integers(-2 ** 63, 2 ** 63 - 1, b + 1, dtype=np.int64)
    meta[:, K.FSRC], meta[:, K.FDST] = rng.integers(0, 6, b + 1), rng.integers(0, 6, b + 1)
    lens = rng.integers(0, w - width + 1, b + 1)
    if odd:
        pick = rng.integers(0, 5)
        if pick == 0:
            table[rng.random(table.shape) < 0.15] = rng.integers(-3, pool + 3)
        elif pick == 1:
            meta[:, K.ROW] = rng.integers(-2, 5, b + 1)
        elif pick == 2:
            lens = rng.integers(-3, w + 3, b + 1)
        elif pick == 3:
            lens[rng.integers(0, b + 1)] = rng.choice([2 ** 62, -2 ** 62, 2 ** 63 - 1])
        else:
            meta[:, K.FSRC], meta[:, K.FDST] = rng.integers(-3, 9, (2, b + 1))
    return dict(kv=kv, ekv=ekv, table=table, meta=meta, lens=lens)


def _few_case(name, rng, model):
    """(kernel, its arguments as numpy arrays and values) of model kernel ``name``."""
    from overlapcheck.engine import backup_check as BK
    from overlapcheck.engine import drafts_eagle as DE
    from overlapcheck.engine import drafts_mtp as DM
    from overlapcheck.engine import kernels as K
    b, k = int(rng.integers(1, 6)) if rng.random() < 0.6 else 1, int(rng.integers(0, 4))
    width = k + 1
    x = _few_inputs(rng, b, width)
    kv, ekv, table, meta, lens = x["kv"], x["ekv"], x["table"], x["meta"], x["lens"]
    toks = rng.integers(0, 50, (b + 1, width + 1))
    hid = rng.integers(0, 2 ** 31, (b + 1, 1))
    if rng.random() < 0.2:
        hid[0, 0] = rng.choice([2 ** 63 - 5, -2 ** 63])
    gate = K.NOW if rng.random() < 0.5 else None
    if name == "write_table":
        w = table.shape[1]
        cells = np.stack([rng.integers(0, 3, 12), rng.integers(0, w, 12),
                          rng.integers(0, 40, 12)], 1)
        cells[:, 1] += np.where(cells[:, 0] < 2, w * (rng.random(12) < 0.2), 0)   # next row
        if rng.random() < 0.25:
            cells[rng.integers(0, 12), rng.integers(0, 2)] = rng.choice([-1, -w - 1, 3 * w,
                                                                           2 ** 62])
        return K.write_table, (table, cells, int(rng.integers(0, 13)))
    if name == "accept":
        tgt = toks.copy()
        tgt[rng.random(tgt.shape) < 0.3] = 51
        return K.accept, (np.roll(toks, 1, 1) if rng.random() < 0.5 else toks, tgt,
                          rng.integers(0, 9, (b + 1, width + 1)), rng.integers(0, 9, b + 1),
                          k, b)
    if name == "stash":
        acc = rng.integers(1, width + 2, b + 1) if rng.random() < 0.8 else \
            rng.integers(-1, width + 4, b + 1)
        return K.stash, (rng.integers(0, 50, 6), rng.integers(0, 50, 6), meta, lens, toks, acc,
                         b, K.ROW if rng.random() < 0.5 else K.FDST)
    if name in ("reset_span", "note_backup"):
        span = rng.integers(0, table.shape[1], (3, 2))
        if rng.random() < 0.3:
            meta[:, K.START] = rng.choice([2 ** 62, 2 ** 63 - 1])
            meta[:, K.N] = rng.choice([2 ** 62, 5])
        if name == "reset_span":
            return BK.reset_span, (span, meta, b)
        span[:, 1] = np.where(rng.random(3) < 0.7, lens[:3] if b >= 2 else lens[0], span[:, 1])
        return BK.note_backup, (span, meta, lens, rng.integers(0, width + 1, b + 1), b)
    if name == "backup_kv":
        host_table = np.where(rng.random(table.shape) < 0.9, table,
                              rng.integers(-1, kv.shape[0] + 1, table.shape))
        acc = rng.integers(0, width + 2, b + 1)
        return K.backup_kv, (kv, rng.integers(0, 9, kv.shape), table, host_table, meta, lens,
                             acc, width, b)
    if name in ("restore", "ahead_stash"):
        k = max(k, 1)       # (k = 0: torch indexes an empty row with any slot; numpy refuses)
        fm_drafts = rng.integers(0, 50, (6, k if rng.random() < 0.9 else k + 1))
        kernel = K.restore if name == "restore" else K.ahead_stash
        return kernel, (fm_drafts, meta, toks, k, b, K.ROW if rng.random() < 0.5 else K.FDST)
    if name == "ahead_start":
        acc = rng.integers(1, width + 2, b + 1) if rng.random() < 0.8 else \
            rng.integers(-1, width + 3, b + 1)
        return K.ahead_start, (meta, lens, toks, acc, rng.integers(0, 9, (b + 1, width + 1)),
                               rng.integers(0, 9, b + 1), b)
    if name == "check_backup":
        w = table.shape[1]
        span = np.stack([rng.integers(-1, w, 3), rng.integers(0, w + 2, 3)], 1)
        if rng.random() < 0.2:
            span[rng.integers(0, 3)] = [2 ** 62, -2 ** 62]
        host_kv = kv.copy()
        host_kv[rng.random(host_kv.shape) < 0.1] = 99        # rows that differ
        host_table = np.where(rng.random(table.shape) < 0.8, table,
                              rng.integers(-1, kv.shape[0] + 1, table.shape))
        tags = (0, 1, 2) if rng.random() < 0.7 else (2, 0, 1)
        return BK.check_backup, (kv, host_kv, table, host_table, span, meta,
                                 rng.integers(0, 9, (b + 1, 15)), tags, b)
    if name == "verify":
        return K.verify, (model, kv, table, meta, toks, lens, rng.integers(0, 9, (b + 1, width)),
                          width, b)
    if name == "decode":
        return K.decode, (model, kv, table, meta, toks, lens, rng.integers(0, 9, (b + 1, 2)),
                          rng.integers(0, 9, b + 1), b)
    dst = K.ROW if rng.random() < 0.5 else K.FDST
    topk = 1 if rng.random() < 0.6 else int(rng.integers(2, 4))     # a chain or a tree
    fm_draft = rng.integers(0, 50, 6 if topk == 1 else (6, topk))
    fm_hid = rng.integers(0, 2 ** 31, (6, 1))
    if name in ("eagle_prefill", "mtp_prefill_seed"):
        w = table.shape[1]
        meta[:, K.START], meta[:, K.N] = rng.integers(0, w, b + 1), rng.integers(1, 4, b + 1)
        if rng.random() < 0.15:     # poison lengths: their sum wraps around in int64
            meta[:, K.START], meta[:, K.N] = 2 ** 62 + 5, 2 ** 62 + rng.integers(0, 9, b + 1)
        meta[:, K.NEXT] = rng.integers(0, 50, b + 1)
        if name == "mtp_prefill_seed":
            return DM.mtp_prefill_seed, (model, kv, table, meta, fm_hid, b, dst)
        ptok = np.stack([rng.integers(0, 3, 12), rng.integers(0, w + 1, 12),
                         rng.integers(0, 50, 12), rng.integers(0, 5, 12)], 1)
        if rng.random() < 0.15:
            ptok[rng.integers(0, 12), rng.integers(0, 2)] = rng.choice([-1, w + 2, -2 ** 63])
        return DE.eagle_prefill, (model, model.head("eagle"), kv, ekv, table, ptok, meta,
                                  toks, fm_draft, fm_hid, int(rng.integers(0, 13)), b, dst, topk)
    if name == "mtp_seed":
        return DM.mtp_seed, (model, kv, table, meta, lens, rng.integers(0, width + 1, b + 1),
                             fm_hid, b, dst)
    j = int(rng.integers(1, width + 1))
    if name == "tree_verify":
        topk, k = int(rng.integers(2, 4)), int(rng.integers(1, 4))
        n = 1 + k * topk
        x = _few_inputs(rng, b, n)       # room in the rows for the tree's n positions
        return K.tree_verify, (model, x["kv"], x["table"], x["meta"],
                               rng.integers(0, 50, (b + 1, n)), x["lens"],
                               rng.integers(0, 9, (b + 1, n)), k, topk, b)
    if name == "draft_step":
        return K.draft_step, (model, kv, table, meta, toks, lens, j, b, gate)
    if name == "draft_extend":
        acc = rng.integers(1, width + 1, b + 1) if rng.random() < 0.8 else \
            rng.integers(-1, width + 3, b + 1)
        return K.draft_extend, (model, kv, table, meta, toks, lens, acc, width, b)
    if name == "tree_eagle_step":
        topk, j = int(rng.integers(2, 4)), int(rng.integers(2, 5))
        tree = rng.integers(0, 50, (b + 1, 1 + 4 * topk))
        return DE.tree_eagle_step, (model, model.head("eagle"), ekv, table, meta, tree, lens, hid,
                                    j, topk, b)
    if name == "eagle_step":
        return DE.eagle_step, (model, model.head("eagle"), ekv, table, meta, toks, lens, hid,
                               j, b, gate)
    if name == "mtp_step":
        return DM.mtp_step, (model, model.head("mtp"), kv, table, meta, toks, lens,
                             rng.integers(0, 2 ** 31, (6, 1)), hid, j, b, int(rng.integers(0, 2)),
                             gate, None, K.ROW if rng.random() < 0.5 else K.FSRC)
    acc = rng.integers(1, width + 1, b + 1) if rng.random() < 0.8 else \
        rng.integers(-1, width + 3, b + 1)
    return DE.eagle_extend, (model, model.head("eagle"), kv, ekv, table, meta, lens, toks[:, :width],
                             acc, fm_draft, fm_hid, width, b, bool(rng.random() < 0.2), dst,
                             topk)


@pytest.mark.parametrize("name", ["verify", "decode", "eagle_step", "eagle_extend", "mtp_step",
                                  "eagle_prefill", "mtp_prefill_seed", "mtp_seed",
                                  "write_table", "accept", "stash", "check_backup",
                                  "tree_eagle_step", "draft_step", "draft_extend",
                                  "tree_verify", "reset_span", "note_backup", "backup_kv",
                                  "ahead_start", "restore", "ahead_stash"])
def test_host_runs_match_torch(name):
    """The sim's host run of each kernel (its one source on numpy views of its tensors)
    writes what the kernel writes on torch, and refuses what it refuses: entries sharing
    a table row and its slots, gated and ungated steps, last chunks or not, poison KV
    values, hidden states and lengths, seeds anywhere in int64, rows, lengths, positions,
    slots and FutureMap slots out of range."""
    from fake_models.oracle import OracleModel
    rng = np.random.default_rng(sum(map(ord, name)))
    checked = 0
    for i in range(400):
        model = OracleModel(vocab=50, agreement=60, salt=i % 3)
        kernel, args = _few_case(name, rng, model)
        want = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
        got = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
        t = [torch.from_numpy(a) if isinstance(a, np.ndarray) else a for a in want]
        try:
            kernel(*t)
        except (IndexError, RuntimeError):
            with pytest.raises(Exception):
                kernel.host_run(*got)
            continue
        kernel.host_run(*got)
        for g, w in zip(got, want):
            if isinstance(g, np.ndarray):
                assert (g == w).all(), (name, i)
        checked += 1
    assert checked > 200
