"""The engine's memory: paged KV pool with ledger and pending-free rule, request rows,
config validation."""
import pytest

from overlapcheck.engine import EngineConfig
from overlapcheck.engine.memory import KVPool, RowPool


def _pool(**kw):
    return KVPool(EngineConfig(**{"page_size": 4, "pool_tokens": 160, "row_width": 32, **kw}))


def test_check_then_act_and_ledger():
    pool = _pool()
    assert pool.total == 39                      # page 0 is the padding page
    assert pool.can_allocate(39) and not pool.can_allocate(40)
    pages = pool.allocate(3, rid=7, purpose="prefill", step=2)
    assert 0 not in pages and pool.free_pages == 36
    led = pool.ledger()
    assert len(led) == 12 and {(o.rid, o.purpose, o.step) for o in led.values()} == {(7, "prefill", 2)}
    with pytest.raises(MemoryError):
        pool.allocate(37, rid=8, purpose="draft", step=3)
    pool.check_integrity()


def test_pending_free_returns_when_batch_processed():
    pool = _pool()
    pages = pool.allocate(2, 1, "draft", 0)
    assert pool.release(pages, 1, after=5) == []
    assert pool.pending_pages == 2 and pool.free_pages == 37
    pool.check_integrity()
    assert pool.on_processed(4) == []
    assert sorted(pool.on_processed(5)) == sorted(pages)
    assert pool.free_pages == 39 and pool.pending_pages == 0


def test_release_by_a_non_owner_and_double_free_are_refused():
    pool = _pool()
    pages = pool.allocate(1, 1, "prefill", 0)
    with pytest.raises(ValueError, match="owned by"):
        pool.release(pages, 2, after=None)
    pool.release(pages, 1, after=None)
    with pytest.raises(ValueError):
        pool.release(pages, 1, after=None)


def test_integrity_catches_a_page_in_two_places_and_a_lost_page():
    pool = _pool()
    pages = pool.allocate(2, 1, "prefill", 0)
    pool.free.append(pages[0])
    with pytest.raises(AssertionError, match="both"):
        pool.check_integrity()
    pool.free.pop()
    del pool.owned[pages[1]]
    with pytest.raises(AssertionError, match="accounts for 38 of 39"):
        pool.check_integrity()


def test_row_pool():
    rows = RowPool(2)
    a, b = rows.allocate(10), rows.allocate(11)
    assert {a, b} == {0, 1} and not rows.can_allocate()
    rows.release(a, 10)
    with pytest.raises(ValueError):
        rows.release(b, 10)
    rows.check_integrity()


@pytest.mark.parametrize("kw, msg", [
    ({"page_size": 0}, "page_size"),
    ({"page_size": 4, "pool_tokens": 130}, "multiple of page_size"),
    ({"row_width": 8}, "draft margin"),
    ({"pool_tokens": 64, "row_width": 64}, "one full row"),
    ({"draft_kind": "tree"}, "draft_kind"),
    ({"draft_reserve": "triple"}, "draft_reserve"),
])
def test_config_validation(kw, msg):
    with pytest.raises(ValueError, match=msg):
        EngineConfig(**kw)


def test_config_is_frozen():
    cfg = EngineConfig()
    with pytest.raises(Exception):
        cfg.page_size = 2
    assert cfg.max_context == cfg.row_width - 2 * (cfg.spec_steps + 1)


def test_ledger_view_counts_without_building():
    """A pool view made with its size (the host pool's ledger in every snapshot: the
    kv-accounting checker counts it each step) reads that size without building the
    tuple, and the size is the built tuple's length; through random allocations,
    releases (pending or not), batches processed and pages both owned and pending (a
    bug's double bookkeeping, which the ledger counts once)."""
    import random
    from overlapcheck.engine.memory import Owner
    rng = random.Random(5)
    for ps in (1, 2, 4):
        pool, held, bid = _pool(page_size=ps), {}, 0
        for _ in range(300):
            op = rng.random()
            if op < 0.4 and pool.can_allocate(2):
                rid = rng.randrange(6)
                held.setdefault(rid, []).extend(pool.allocate(rng.randint(1, 2), rid, "p", 0))
            elif op < 0.7 and held:
                rid = rng.choice(sorted(held))
                pages = held.pop(rid)
                pool.release(pages, rid, rng.choice((None, bid, bid + 1)))
            elif op < 0.9:
                pool.on_processed(bid)
                bid += 1
            dup = None
            if pool.owned and rng.random() < 0.2:     # a page both owned and pending
                dup = pool.pending.setdefault(-1, {})
                dup[rng.choice(sorted(pool.owned))] = Owner(99, "dup", 0)
            v = pool.view(pool.ledger_rows, pool.ledger_size())
            n = len(v)
            assert v._value is None                 # counted, not built
            assert n == len(v.get()) == len(pool.ledger_rows())
            if dup is not None:
                del pool.pending[-1]
