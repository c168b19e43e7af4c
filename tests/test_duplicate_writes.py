"""Indexed writes with duplicate indices: CPU keeps the last value, CUDA an unspecified
one. A KV write with ``keep`` passes its masked entries' slots too, so a masked entry
may share a slot with a kept one (EAGLE's prefill: the first prompt token has no pair,
its masked entry lands on position 0, which the second token's pair writes in the same
call). The result must not depend on the order duplicates are applied in: emulated
here by applying the entries in reverse order, and checked on the sim by the exact
access inference (``DuplicateWriteError``)."""
import pytest
import torch

from fake_models import make_model
from overlapcheck.device import DuplicateWriteError, make_runtime
from overlapcheck.engine import Engine, EngineConfig
from overlapcheck.engine.drafts import DRAFT_KINDS
from overlapcheck.protocol import generate


pytestmark = pytest.mark.usefixtures("one_thread")


def _old(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(0, 1 << 30, shape, generator=g, dtype=dtype)


def _cases():
    """(rows, pos, keep) of one call: a two-request EAGLE prefill chunk (first tokens
    masked at clamped position 0) and an extend whose masked tail reads unwritten
    table cells (the padding slot 0) of both requests."""
    q = torch.tensor([0, 1, 2, 3, 0, 1, 2])
    rows = torch.tensor([0, 0, 0, 0, 1, 1, 1])
    yield "prefill", rows, (q - 1).clamp(min=0), q >= 1
    rows = torch.tensor([0, 0, 0, 1, 1, 1])
    pos = torch.tensor([2, 3, 9, 1, 8, 9])
    yield "extend", rows, pos, torch.tensor([True, True, False, True, False, False])


def _table():
    t = torch.zeros((2, 12), dtype=torch.int64)       # unwritten cells: padding slot 0
    t[0, :6] = torch.arange(4, 10)
    t[1, :4] = torch.arange(12, 16)
    return t


def _flip(args):
    return [a.flip(0) if isinstance(a, torch.Tensor) else a for a in args]


def _both_orders(write, width, dtype, args):
    """The buffer after ``write(buf, table, *args)`` with the entries in their order and in
    reverse order (as CUDA may apply duplicates)."""
    out = []
    for a in (args, _flip(args)):
        buf = _old((20, width), dtype, 7)
        write(buf, _table(), *a)
        out.append(buf)
    return out


def _writers(name):
    m = make_model(name)
    head = m.head("eagle")
    d, hd = m.hidden_width, m.hidden_dtype

    def eagle(buf, table, rows, pos, keep, feats):
        head.write(buf, table, rows, pos, (pos * 5 + rows) % 50, feats[:, :d].to(hd),
                   rows + 100, keep=keep)

    def target(buf, table, rows, pos, keep, feats):
        m.write_kv(buf, table, rows, pos, (pos * 3 + rows) % 50, rows + 100, keep=keep)

    kd = getattr(m, "kv_dtype", torch.int64)
    yield "eagle", eagle, head.kv_width, head.kv_dtype
    yield "target", target, m.kv_width, kd


@pytest.mark.parametrize("model", ["oracle", "tiny"])
def test_keep_writes_do_not_depend_on_duplicate_order(model):
    for what, write, width, dtype in _writers(model):
        for case, rows, pos, keep in _cases():
            feats = _old((rows.shape[0], 64), torch.int64, 3)
            fwd, rev = _both_orders(write, width, dtype, [rows, pos, keep, feats])
            assert torch.equal(fwd, rev), f"{model} {what} write, {case}: result depends " \
                                          f"on the order duplicate slots are applied in"
            # and it is the intended one: kept entries written, other slots untouched
            slots = _table()[rows, pos]
            untouched = torch.ones(20, dtype=torch.bool)
            untouched[slots[keep]] = False
            assert torch.equal(fwd[untouched], _old((20, width), dtype, 7)[untouched])


def test_inference_flags_order_dependent_writes():
    rt = make_runtime("sim", seed=0, strategy="eager")
    s = rt.new_stream("s")
    kv = rt.empty((8, 2), torch.int64, "kv", s)
    idx = torch.tensor([3, 5, 3])
    same = torch.tensor([[1, 1], [2, 2], [1, 1]])
    rt.launch(s, lambda t, i, v: t.__setitem__(i, v), kv.t, idx, same, writes=[kv])
    rt.launch(s, lambda t, i, v: t.index_put_((i,), v, accumulate=True), kv.t, idx,
              same + torch.tensor([[0], [0], [1]]), writes=[kv])
    s.synchronize()
    differ = torch.tensor([[1, 1], [2, 2], [1, 4]])
    rt.launch(s, lambda t, i, v: t[:, 1:].__setitem__(i, v), kv.t, idx, differ[:, 1:],
              writes=[kv], name="dup")
    with pytest.raises(DuplicateWriteError, match=r"'dup'.*index \(3,\).*entries 0 and 2"):
        s.synchronize()


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("model", ["oracle", "tiny"])
@pytest.mark.parametrize("kind", tuple(DRAFT_KINDS))
def test_engine_writes_are_order_independent(kind, model, overlap):
    """Every indexed write of a spec run (target, draft KV, EAGLE KV, FutureMap) under
    exact inference: none writes one index twice with different values."""
    cfg = EngineConfig(page_size=4, pool_tokens=512, row_width=64, max_running=6,
                       chunk_size=16, draft_kind=kind, model=model, overlap=overlap)
    rt = make_runtime("sim", seed=1, strategy="random", access="infer")
    Engine(cfg, rt, make_model(model)).run(generate(1, 6, cfg, max_new=12))
    assert not rt.reports
