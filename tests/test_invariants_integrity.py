"""pool-integrity and config-effect: each sees its planted violations, through synthetic
events and through engines with a planted bug (the bug zoo's sites and test-only engine
subclasses), naming the step and both facts; each stays quiet on clean runs of every
mode, where the modes' counts show they ran."""
import dataclasses

import pytest

from invariants import make_checkers
from overlapcheck.engine import Engine, EngineConfig
from overlapcheck.protocol import RequestSpec, Workload, generate
from overlapcheck.protocol import events as E
from overlapcheck.run import run_checked

BASE = EngineConfig(page_size=2, pool_tokens=96, row_width=32, max_running=4, chunk_size=8,
                    spec_steps=3)
OLD = ("kv-accounting", "kv-lifetime", "kv-canary", "stream-race", "parity", "metrics",
       "no-hidden-sync", "lifecycle", "liveness", "rank-agreement", "host-race", "golden",
       "accept-oracle", "kv-backup", "runtime-memory")


def _feed(name, events, **context):
    (chk,) = make_checkers([name], **context)
    out = []
    for ev in events:
        out += chk.feed(ev)
    return out + chk.finish()


def _snap(**kw):
    base = dict(total=16, free=16, owned=0, pending=0, ledger=(), pending_slots=(),
                requests=(), inflight=(), rows_free=4, idle=False, syncs=0, declared_syncs=0,
                page_size=2, row_width=32, rows_total=4, rows_free_list=(3, 2, 1, 0), live=())
    base.update(kw)
    return E.Snapshot(**base)


def _req(rid, row, allocated, shared=0, state="running"):
    return E.ReqState(rid, state, row, 4, allocated, 1, (), shared)


# -- pool-integrity: planted ---------------------------------------------------------------------
def test_pool_integrity_phantom_and_foreign_rows():
    phantom = _snap(rows_free_list=(1, 3, 2, 1, 0), rows_free=5)
    (v,) = _feed("pool-integrity", [E.StepEnd(5, 2, phantom)])
    assert v.step == 5 and v.site == ("rows", "phantom")
    assert "free 5 + held 0 = 5 of 4 rows" in v.message and "row(s) 1 listed free" in v.message
    assert "== 4 rows" in v.expected and "[1, 3, 2, 1, 0]" in v.seen
    # a row held for a request that says it holds another one, and one the events never gave
    held = _snap(rows_free_list=(3, 2, 1), rows_free=3, rows_held=((0, 7),),
                 live=(_req(7, 1, 0),))
    got = _feed("pool-integrity", [E.RowAssigned(1, 0, 7, 1), E.StepEnd(2, 0, held)])
    assert {v.site for v in got} == {("rows-events",), ("row-owner",)}
    assert any("holds row 1" in v.seen for v in got)


def test_pool_integrity_radix_nodes_against_keys_pool_and_readers():
    # node 2: 5 pages for 8 positions (page size 2); node 3 below it with a lock above its
    # parent's; the tree counts 6 pages, the pool caches page 9 in no node
    nodes = ((2, 1, 8, (1, 2, 3, 4, 12), 1, 2), (3, 2, 2, (5,), 2, 0))
    ledger = tuple((s, 0, 0) for p in (1, 2, 3, 4, 5, 9, 12) for s in (2 * p, 2 * p + 1))
    snap = _snap(cached=14, cache_nodes=nodes, cache_pages=6, cache_ledger=ledger,
                 free=2, live=(_req(4, None, 0, state="waiting"),))
    got = {v.site: v for v in _feed("pool-integrity", [E.StepEnd(9, 4, snap)])}
    assert set(got) == {("radix-pages",), ("radix-lock",), ("radix-pool",), ("radix-readers",)}
    v = got[("radix-pages",)]
    assert v.step == 9 and "node 2 holds 5 pages, its key covers 8 positions" in v.message
    assert "4 page(s)" in v.expected and "5 page(s) 1-4,12" in v.seen
    assert "lock 1" in got[("radix-lock",)].seen and "children's (2)" in got[("radix-lock",)].expected
    assert "pages 9" in got[("radix-pool",)].seen
    assert "1 lock(s)" in got[("radix-readers",)].seen and "(0:" in got[("radix-readers",)].expected
    # the tree's own count against its nodes', and a page in two nodes
    twice = ((2, 1, 2, (1,), 0, 0), (3, 1, 2, (1,), 0, 0))
    snap = _snap(cached=2, cache_nodes=twice, cache_pages=1, cache_ledger=((2, 0, 0), (3, 0, 0)))
    got = {v.site for v in _feed("pool-integrity", [E.StepEnd(3, 1, snap)])}
    assert got == {("radix-shared-page",), ("radix-count",)}


def test_pool_integrity_ledger_host_pool_and_pages_at_idle():
    # request 3 lists 8 slots of its own (10 allocated, 2 shared), the ledger gives it 6,
    # its host-pool backup 4; an ended request's slots are kv-accounting's, not judged here
    snap = _snap(owned=6, owned_by=((3, 6),), host_total=16, host_owned_by=((3, 4),),
                 rows_free_list=(3, 2, 1), rows_held=((0, 3),),
                 live=(_req(3, 0, 10, shared=2), _req(5, None, 0, state="finished")))
    got = {v.site: v for v in _feed("pool-integrity", [E.RowAssigned(0, 0, 3, 0),
                                                         E.StepEnd(4, 1, snap)])}
    assert set(got) == {("ledger",), ("host-ledger",)}
    assert "allocated 10 - shared 2" in got[("ledger",)].expected
    assert "6 owned slots" in got[("ledger",)].seen and "4 host-pool" in got[("host-ledger",)].seen
    # the pool's pages, at idle only (where strict checked them)
    conflicts = (("kv", 3, ("free", "free")), ("host", 7, ()))
    assert _feed("pool-integrity", [E.StepEnd(4, 1, _snap(page_conflicts=conflicts))]) == []
    got = _feed("pool-integrity", [E.StepEnd(6, -1, _snap(idle=True, page_conflicts=conflicts))])
    assert [v.site for v in got] == [("pages", "kv"), ("pages", "host")]
    assert "kv pool page 3 is free and free at idle" in got[0].message
    assert "in no place" in got[1].seen
    # the per-request counts against the pool's own total
    snap = _snap(owned=8, owned_by=((3, 6),), live=())
    (v,) = _feed("pool-integrity", [E.StepEnd(2, 0, snap)])
    assert v.site == ("ledger-count",) and "8 owned" in v.expected and "6 over" in v.seen


def test_pool_integrity_reports_each_site_once():
    phantom = _snap(rows_free_list=(0, 3, 2, 1, 0), rows_free=5)
    got = _feed("pool-integrity", [E.StepEnd(i, -1, phantom) for i in range(4)])
    assert len(got) == 1 and got[0].step == 0


@pytest.mark.parametrize("fault, extra", [("phantom-pool-row", {}),
                                          ("radix-node-overcovers", {"prefix_cache": True})])
def test_pool_integrity_finds_the_zoo_faults_the_other_checkers_miss(fault, extra):
    cfg = dataclasses.replace(BASE, faults=(fault,), **extra)
    wl = generate(0, 6, cfg, max_prompt=10, max_new=16)
    run = run_checked(cfg, wl, seed=0)
    assert [v.checker for v in run.violations] == ["pool-integrity"], \
        "\n".join(map(str, run.violations))
    v = run.violations[0]
    assert v.site[0] == ("rows" if fault == "phantom-pool-row" else "radix-pages")
    assert v.expected and v.seen and v.step < run.steps
    assert not run_checked(cfg, wl, OLD, seed=0).violations


class KeepsRow(Engine):
    """The pool never takes request 1's row back, though the engine reports it released."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        release = self.mem.rows.release
        self.mem.rows.release = lambda row, rid: None if rid == 1 else release(row, rid)


def test_pool_integrity_names_a_row_held_for_an_ended_request():
    wl = Workload((RequestSpec(0, 0, (1, 2, 3), 6), RequestSpec(1, 0, (4, 5, 6), 4)))
    run = run_checked(BASE, wl, seed=1, engine=KeepsRow)
    got = {v.site: v for v in run.violations}
    assert set(got) == {("rows-events",), ("row-owner",)}, "\n".join(map(str, run.violations))
    v = got[("row-owner",)]
    assert "held for request 1" in v.message and "finished" in v.seen


# -- pool-integrity: clean ----------------------------------------------------------------------
MODES = {"overlap": {}, "no-overlap": {"overlap": False}, "no-spec": {"spec": False},
         "zero-bubble": {"zero_bubble": True}, "kv-backup": {"kv_backup": True},
         "verify-sync": {"verify_sync": True}, "ring": {"future_map": "ring"},
         "forward-thread": {"forward_thread": True}, "tp": {"tp": 2},
         "prefix-cache": {"prefix_cache": True},
         "prefix-cache-backup": {"prefix_cache": True, "kv_backup": True, "page_size": 4,
                                 "row_width": 40, "pool_tokens": 120},
         "tree": {"topk": 2, "row_width": 40, "pool_tokens": 128},
         "tight": {"pool_tokens": 40, "zero_bubble": True, "draft_reserve": "exact"}}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_clean_modes_report_nothing_and_ran(mode):
    cfg = dataclasses.replace(BASE, **MODES[mode])
    ran = {}
    for seed in range(3):
        wl = generate(seed, 8, cfg, max_prompt=12, max_new=16)
        for strategy in ("random", "pct"):
            run = run_checked(cfg, wl, ["pool-integrity", "config-effect", "kv-accounting"],
                              seed=seed, strategy=strategy)
            assert run.status == "completed" and not run.violations, \
                "\n".join(map(str, run.violations[:3]))
            for k, n in run.engine.snapshot().ran:
                ran[k] = ran.get(k, 0) + n
    want = {"forward_thread": cfg.forward_thread, "zero_bubble": cfg.zero_bubble,
            "kv_backup": cfg.kv_backup, "verify_sync": cfg.verify_sync and cfg.overlap,
            "ring": cfg.future_map == "ring", "prefix_cache": cfg.prefix_cache,
            "tree": cfg.tree, "overlap": cfg.overlap}
    for k, on in want.items():
        assert bool(ran[k]) == on, (k, ran)
    assert ran.get("tp") == (12 if cfg.tp > 1 else None)


# -- config-effect: planted ------------------------------------------------------------------------
def _ran(**kw):
    out = dict.fromkeys(("forward_thread", "overlap", "zero_bubble", "kv_backup", "tree",
                         "verify_sync", "ring", "prefix_cache"), 0)
    out.update(**kw)
    return tuple(sorted(out.items()))


def test_config_effect_reports_a_mode_that_never_ran_where_reachable():
    cfg = dataclasses.replace(BASE, forward_thread=True, kv_backup=True)
    evs = [E.Launched(0, 0, "prefill", ()), E.Launched(1, 1, "decode", ()),
           E.StepEnd(1, 1, _snap(ran=_ran(overlap=2, kv_backup=1))), E.RunEnd(2, -1, None)]
    (v,) = _feed("config-effect", evs, engine_config=cfg)
    assert v.step == 2 and v.site == ("never-ran", "forward_thread")
    assert "2 batches launched" in v.expected and "forward thread: 0" in v.seen
    # unreachable: no decode batch, so the KV backup never had one to copy
    evs = [E.Launched(0, 0, "prefill", ()), E.StepEnd(0, 0, _snap(ran=_ran(overlap=1,
                                                                             forward_thread=1))),
           E.RunEnd(1, -1, None)]
    assert _feed("config-effect", evs, engine_config=cfg) == []
    # nothing launched: nothing to judge
    assert _feed("config-effect", [E.StepEnd(0, -1, _snap(ran=_ran())), E.RunEnd(1, -1, None)],
                 engine_config=cfg) == []


def test_config_effect_prefix_cache_reachability():
    cfg = dataclasses.replace(BASE, prefix_cache=True)
    a = RequestSpec(0, 0, (5, 6, 7, 8), 4)
    b = RequestSpec(1, 9, (5, 6, 7, 1, 2), 4)
    c = RequestSpec(2, 9, (5, 6, 9, 1, 2), 4)        # another first page: no hit due
    head = [E.Arrived(0, -1, 0, a), E.Arrived(9, -1, 1, b), E.Arrived(9, -1, 2, c),
            E.Launched(0, 0, "prefill", ()), E.Cached(8, 3, 0, (2, 3, 4, 5))]
    end = [E.StepEnd(10, 4, _snap(ran=_ran(overlap=5))), E.RunEnd(11, -1, None)]
    (v,) = _feed("config-effect", head + [E.RowAssigned(10, 4, 1, 0)] + end, engine_config=cfg)
    assert v.site == ("never-ran", "prefix_cache") and "request 1, admitted at step 10" in v.message
    assert _feed("config-effect", head + [E.RowAssigned(10, 4, 2, 0)] + end,
                 engine_config=cfg) == []
    evicted = [E.Evicted(9, 3, (2, 3), False, None), E.RowAssigned(10, 4, 1, 0)]
    assert _feed("config-effect", head + evicted + end, engine_config=cfg) == []


class NoMatch(Engine):
    """The prefix cache never matches (admissions compute every prefix)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        mem = self.mem

        def hold_prefix(toks):
            node = mem.tree.root
            mem.tree.lock(node)
            return node, []
        mem.hold_prefix = hold_prefix


class NeverOverlaps(Engine):
    def _overlaps(self, batch):
        return False


def _shared_workload(cfg):
    prompt = tuple(range(1, 9))
    return Workload((RequestSpec(0, 0, prompt, 3), RequestSpec(1, 12, prompt + (9,), 3)))


@pytest.mark.parametrize("engine, mode, extra", [(NoMatch, "prefix_cache", {"prefix_cache": True}),
                                                 (NeverOverlaps, "overlap", {})])
def test_config_effect_finds_a_mode_that_silently_did_not_run(engine, mode, extra):
    cfg = dataclasses.replace(BASE, **extra)
    wl = _shared_workload(cfg)
    run = run_checked(cfg, wl, seed=0, engine=engine)
    assert [v.site for v in run.violations] == [("never-ran", mode)], \
        "\n".join(map(str, run.violations))
    assert not run_checked(cfg, wl, OLD, seed=0, engine=engine).violations
    clean = run_checked(cfg, wl, seed=0)      # the same workload on the clean engine: it ran
    assert not clean.violations and dict(clean.engine.snapshot().ran)[mode]


def test_config_effect_finds_the_forward_thread_skipped():
    cfg = dataclasses.replace(BASE, forward_thread=True, faults=("forward-thread-skipped",))
    wl = generate(1, 4, cfg, max_prompt=8, max_new=8)
    run = run_checked(cfg, wl, seed=1)
    assert [v.site for v in run.violations] == [("never-ran", "forward_thread")]
    assert not run_checked(cfg, wl, OLD, seed=1).violations
