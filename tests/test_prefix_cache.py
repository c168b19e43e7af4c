"""The radix prefix cache (``EngineConfig(prefix_cache=True)``, docs/design.md §4.13): the
tree's match, split, insert, lock counts and LRU eviction; the clean engine on it
equals the engine without it on every draft kind and mode (overlap == non-overlap,
spec == no-spec, every checker quiet, golden included) under memory pressure that
evicts and retracts; kv-accounting and the leak report know shared ownership and
name a lock kept past its request's end; generated workloads and the fuzzer share
prefixes; ``run --prefix-cache``."""
import collections
import dataclasses
import json

import pytest
from hypothesis import HealthCheck, Phase, given, settings

from invariants import make_checkers
from invariants.runlog import RunLog
from overlapcheck.cli import main
from overlapcheck.device import make_runtime
from overlapcheck.engine import EngineConfig
from overlapcheck.engine.radix import RadixCache, pair_keys
from overlapcheck.fuzz.strategies import cases
from overlapcheck.protocol import RequestSpec, Workload, generate
from overlapcheck.protocol import events as E
from overlapcheck.run import Case, ScheduleSpec, execute

from engine_checks import ENGINE_MODES, assert_parity, run_clean, twins_agree

pytestmark = pytest.mark.usefixtures("one_thread")

MODES = {**ENGINE_MODES, "tp2": {"tp": 2}, "ring": {"future_map": "ring"},
         "forward-thread": {"forward_thread": True}}
# a pool of about three rows: admissions evict cached prefixes, decodes retract
BASE = dict(page_size=2, pool_tokens=80, row_width=28, max_running=4, chunk_size=6,
            spec_steps=3, prefix_cache=True)
LAG = ScheduleSpec("stalls", 0, (("forward", 0, 10 ** 9),))


class Counts:
    """A run log that only counts events by class."""

    def __init__(self):
        self.n = collections.Counter()

    def event(self, ev):
        self.n[type(ev).__name__] += 1

    def violation(self, v):
        pass

    def end(self, *a):
        pass


# -- the tree --------------------------------------------------------------------------------
def test_pair_keys_hold_the_next_token():
    assert pair_keys((5, 6, 7, 8), 3) == ((5, 6), (6, 7), (7, 8))
    assert pair_keys((5,), 0) == ()


def test_match_insert_split_and_duplicates():
    t = RadixCache(2)
    a = pair_keys((1, 2, 3, 4, 5, 6, 7), 6)
    assert t.insert(a, [10, 11, 12], fence=-1) == 0 and t.pages == 3
    node, pages = t.match(pair_keys((1, 2, 3, 4, 5, 9), 5))    # 4 pairs agree: 2 pages
    assert pages == [10, 11] and node.key == a[:4]              # the leaf split at the match
    # position 3's pair holds the token after it: (4, 9) is not (4, 5), one page is left
    assert t.match(pair_keys((1, 2, 3, 4, 9, 9), 5))[1] == [10]
    assert t.match(pair_keys((1, 2, 3, 9), 3))[1] == [10]
    assert t.match(pair_keys((1, 2), 1))[1] == []               # less than a page
    # a second request with its first page the same: the tree keeps its own page, the
    # request's copy of it is a duplicate (the caller frees it)
    b = pair_keys((1, 2, 3, 4, 8, 8, 8), 6)
    assert t.insert(b, [20, 21, 22], fence=-1) == 2 and t.pages == 5
    assert t.match(b)[1] == [10, 21, 22] and t.match(a)[1] == [10, 11, 12]
    t.check_integrity()


def test_locks_protect_and_lru_evicts_leaves_first():
    t = RadixCache(1)
    t.insert(pair_keys((1, 2, 3, 4), 3), [1, 2, 3], fence=-1)
    assert t.insert(pair_keys((1, 2, 9, 9), 3), [1, 5, 6], fence=-1) == 1   # page 1: a duplicate
    node, pages = t.match(pair_keys((1, 2, 9, 9), 3))
    assert pages == [1, 5, 6]
    t.lock(node)
    assert t.page_locks() == {1: 1, 2: 0, 3: 0, 5: 1, 6: 1} and t.evictable() == 2
    assert t.evict(5) == [([2, 3], -1)]               # only the unlocked leaf goes
    t.unlock(node, fence=7)
    assert t.evictable() == 3
    got = t.evict(5)
    assert got == [([5, 6], 7), ([1], 7)] and t.pages == 0     # leaf first, then its parent
    with pytest.raises(AssertionError, match="no lock"):
        t.unlock(node, 0)


def test_lru_order_is_the_logical_clock():
    t = RadixCache(1)
    t.insert(pair_keys((1, 1, 1), 2), [1, 2], fence=-1)
    t.insert(pair_keys((2, 2, 2), 2), [3, 4], fence=-1)
    t.match(pair_keys((1, 1, 1), 2))                 # touched: the other goes first
    assert t.evict(1) == [([3, 4], -1)]


# -- the engine --------------------------------------------------------------------------------
def _wl(cfg, seed, n=8):
    return generate(seed, n, cfg, max_prompt=14, max_new=16)


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("kind", ["standalone", "eagle", "mtp"])
def test_prefix_cache_runs_clean_and_equals_the_engine_without_it(kind, mode):
    cfg = EngineConfig(**{**BASE, "draft_kind": kind, **MODES[mode]})
    plain = dataclasses.replace(cfg, prefix_cache=False, overlap=False, tp=1,
                                zero_bubble=False, kv_backup=False, verify_sync=False,
                                future_map="row", forward_thread=False)
    seen = collections.Counter()
    for seed in range(2):
        wl = _wl(cfg, seed)
        ref = execute(Case(plain, wl, ScheduleSpec("random", seed))).result
        for sched in (LAG, ScheduleSpec("random", seed)):
            log = Counts()
            out = execute(Case(cfg, wl, sched), log=log)
            assert out.status == "completed" and not out.findings, out.findings[0].text
            assert_parity(ref, out.result, f"{kind}/{mode} seed {seed}", accept=cfg.spec)
            seen.update(log.n)
    # the runs reused prefixes, evicted under pressure and (but for one mode) retracted
    assert seen["PrefixLocked"] and seen["PrefixReleased"] == seen["PrefixLocked"]
    assert seen["Cached"] and seen["Evicted"]


@pytest.mark.parametrize("kind", ["standalone", "eagle"])
def test_tree_drafts_on_the_prefix_cache(kind):
    """Tree drafts (§4.12) release the branches' pages after each verify: never the
    shared ones, and with the KV backup the host pages by the request's own index."""
    seen = collections.Counter()
    for extra in ({}, {"kv_backup": True, "pool_tokens": 64}):
        cfg = EngineConfig(**{**BASE, "draft_kind": kind, "topk": 2, "row_width": 32,
                              **extra})
        plain = dataclasses.replace(cfg, prefix_cache=False, overlap=False, kv_backup=False)
        for seed in range(2):
            wl = _wl(cfg, seed)
            ref = execute(Case(plain, wl, ScheduleSpec("random", seed))).result
            log = Counts()
            out = execute(Case(cfg, wl, LAG), log=log)
            assert out.status == "completed" and not out.findings, out.findings[0].text
            assert_parity(ref, out.result, f"tree {kind} {extra} seed {seed}")
            seen.update(log.n)
    assert seen["PrefixLocked"] and seen["Evicted"]


def test_memory_pressure_retracts_requests_that_hold_prefixes():
    cfg = EngineConfig(**{**BASE, "pool_tokens": 60, "zero_bubble": True})
    seen = collections.Counter()
    for seed in range(4):
        log = Counts()
        out = execute(Case(cfg, _wl(cfg, seed), ScheduleSpec("random", seed)), log=log)
        assert out.status == "completed" and not out.findings, out.findings[0].text
        seen.update(log.n)
    assert seen["Retracted"] and seen["Evicted"] and seen["PrefixLocked"]


@pytest.mark.parametrize("kind", ["standalone", "eagle", "mtp"])
def test_spec_equals_no_spec_and_overlap_equals_non_overlap(kind):
    cfg = EngineConfig(**{**BASE, "draft_kind": kind})
    wl = _wl(cfg, 7, 10)
    ref = run_clean(dataclasses.replace(cfg, overlap=False), wl, 7, "eager")
    nospec = run_clean(dataclasses.replace(cfg, overlap=False, spec=False), wl, 7, "eager")
    assert_parity(ref, nospec, f"{kind} spec vs no-spec", accept=False)
    for strategy in ("random", "pct", "buggify"):
        assert_parity(ref, run_clean(cfg, wl, 7, strategy), f"{kind} overlap/{strategy}")


def test_reused_kv_gives_the_same_tokens_as_computing_it():
    """Request 1 arrives after request 0 finished, with request 0's prompt and more: it
    reuses request 0's pages (its first slots hold KV request 0 wrote) and its tokens
    are those of the engine without the cache and of the golden reference."""
    cfg = EngineConfig(**BASE)
    p0 = (3, 1, 4, 1, 5, 9, 2, 6)
    wl = Workload((RequestSpec(0, 0, p0, 6), RequestSpec(1, 30, p0 + (5, 3), 8),
                   RequestSpec(2, 31, p0[:5] + (7,), 8, (), 11, "seeded")))
    events = []
    rt = make_runtime("sim", seed=1, strategy=ScheduleSpec("random", 1).make())
    from fake_models import make_model
    from overlapcheck.engine import Engine
    eng = Engine(cfg, rt, make_model(cfg.model), events.append, strict=True)
    got = eng.run(wl)
    locked = {ev.rid: ev.slots for ev in events if isinstance(ev, E.PrefixLocked)}
    cached0 = {s for ev in events if isinstance(ev, E.Cached) and ev.rid == 0 for s in ev.slots}
    assert set(locked) == {1, 2} and set(locked[1]) <= cached0 and len(locked[1]) == 6
    assert len(locked[2]) == 4                      # two pages: positions 0..3 (pair at 3: (1, 5))
    canaries = [ev for ev in events if isinstance(ev, E.Canary)]
    assert canaries and not any(ev.bad for ev in canaries)
    plain = run_clean(dataclasses.replace(cfg, prefix_cache=False), wl, 1, "random")
    assert_parity(plain, got, "cache vs none")
    out = execute(Case(cfg, wl, ScheduleSpec("random", 1), ("golden", "accept-oracle", "parity")))
    assert not out.findings, out.findings[0].text


def test_tiny_model_and_declared_accesses_under_full_inference():
    cfg = EngineConfig(**{**BASE, "draft_kind": "eagle", "model": "tiny"})
    wl = _wl(cfg, 5, 5)
    ref = run_clean(dataclasses.replace(cfg, overlap=False, prefix_cache=False), wl, 5, "eager")
    assert_parity(ref, run_clean(cfg, wl, 5, "random", access="infer"), "tiny infer")


@pytest.mark.parametrize("kind", ["standalone", "eagle"])
def test_host_runs_give_the_kernels_runs(kind):
    cfg = EngineConfig(**{**BASE, "draft_kind": kind, "model": "oracle-hostlens"})
    wl = _wl(cfg, 3, 7)
    assert not twins_agree(Case(cfg, wl, ScheduleSpec("random", 5))).findings


# -- accounting and the leak report ----------------------------------------------------------------
def _feed(events):
    (chk,) = make_checkers(["kv-accounting"])
    out = []
    for ev in events:
        out += chk.feed(ev)
    return out + chk.finish()


def _snap(free, owned, cached, ledger, cache_ledger, idle=False, inflight=()):
    return E.Snapshot(total=8, free=free, owned=owned, pending=0, ledger=ledger,
                      pending_slots=(), requests=(), inflight=inflight, rows_free=4,
                      idle=idle, syncs=0, declared_syncs=0, cached=cached,
                      cache_ledger=cache_ledger)


def _shared_prefix_events(release: bool):
    """Request 1 caches slots 1-2 at its finish; request 2 locks them, finishes, and
    releases its lock (or not); then the engine goes idle."""
    evs = [E.Allocated(0, 0, 1, "prefill", (1, 2, 3), 0),
           E.Cached(3, 2, 1, (1, 2)), E.Freed(3, 2, 1, (3,), "stop", False, None),
           E.Finished(3, 2, 1, "stop", (7,)),
           E.PrefixLocked(4, 3, 2, (1, 2)), E.Allocated(4, 3, 2, "prefill", (3,), 0),
           E.StepEnd(4, 3, _snap(5, 1, 2, ((3, 2, "prefill", 4),), ((1, 1, 1), (2, 1, 1))))]
    if release:
        evs.append(E.PrefixReleased(6, 4, 2, (1, 2), None))
    evs += [E.Freed(6, 4, 2, (3,), "stop", False, None), E.Finished(6, 4, 2, "stop", (8,)),
            E.StepEnd(6, 4, _snap(6, 0, 2, (), ((1, 1, 0 if release else 1),
                                                (2, 1, 0 if release else 1)), idle=True))]
    return evs


def test_kv_accounting_knows_shared_ownership():
    assert _feed(_shared_prefix_events(True)) == []


def test_kv_accounting_names_a_lock_kept_past_its_finish():
    out = _feed(_shared_prefix_events(False))
    leaks = [v for v in out if v.details.get("kind") == "leak"]
    assert leaks and leaks[0].details["rid"] == 2 and leaks[0].details["purpose"] == "prefix-lock"
    assert leaks[0].details["slots"] == [1, 2] and leaks[0].step == 6
    assert "kept its lock on 2 cached slots" in str(leaks[0])


def test_kv_accounting_planted_eviction_of_a_locked_slot_and_lock_counts():
    evs = _shared_prefix_events(True)[:5] + [
        E.Evicted(5, 3, (1, 2), False, None),
        E.StepEnd(5, 3, _snap(8, 0, 0, (), ()))]
    sites = {v.site for v in _feed(evs)}
    assert ("evict-locked",) in sites
    # the engine's tree says slot 1 is locked twice; the events say once
    evs = _shared_prefix_events(True)[:6]
    evs[-1] = E.StepEnd(4, 3, _snap(5, 1, 2, ((3, 2, "prefill", 4),), ((1, 1, 2), (2, 1, 1))))
    assert ("lock-count",) in {v.site for v in _feed(evs)}


def test_the_fault_is_caught_and_the_leak_report_names_the_lock(tmp_path, capsys):
    cfg = EngineConfig(**BASE)
    p0 = (3, 1, 4, 1, 5, 9, 2, 6)
    wl = Workload((RequestSpec(0, 0, p0, 6), RequestSpec(1, 30, p0 + (5, 3), 8)))
    path = str(tmp_path / "run.jsonl")
    out = execute(Case(cfg, wl, LAG, ("kv-accounting",), ("lock-late-finish",)),
                  log=RunLog(path, {}))
    (f,) = out.findings
    assert f.checker == "kv-accounting" and "kept its lock" in f.text
    assert main(["leak-report", path]) == 1
    text = capsys.readouterr().out
    assert "request 1: lock on 6 cached slot(s) never released" in text and "cached" in text
    assert main(["leak-report", path, "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["leaks"][0]["purpose"] == "prefix-lock" and doc["timeline"][-1]["cached"] > 0
    # clean: cached slots at the end are not a leak
    out = execute(Case(cfg, wl, LAG, ("kv-accounting",)), log=RunLog(path, {}))
    assert not out.findings
    assert main(["leak-report", path]) == 0


# -- workloads, fuzzer, CLI ----------------------------------------------------------------------------
def test_generated_workloads_share_prefixes_only_with_the_cache():
    on = EngineConfig(**BASE)
    off = dataclasses.replace(on, prefix_cache=False)
    a, b = generate(4, 12, off), generate(4, 12, on)
    assert a.aborts == b.aborts
    changed = [(x, y) for x, y in zip(a.requests, b.requests) if x != y]
    assert changed and len(changed) < len(a.requests)
    for x, y in changed:       # an earlier prompt's head, then the request's own prompt
        assert y.arrival >= x.arrival and (x.rid, x.max_new_tokens, x.seed) == \
            (y.rid, y.max_new_tokens, y.seed)
        donors = [r.prompt for r in b.requests if r.rid < y.rid]
        assert any(y.prompt[:m] == d[:m] and y.prompt[m:] == x.prompt[:len(y.prompt) - m]
                   for d in donors for m in range(1, len(d) + 1))


def test_the_fuzzer_draws_the_cache_and_shared_prefixes():
    drawn = []

    @settings(max_examples=60, phases=(Phase.generate,), database=None, derandomize=True,
              deadline=None, suppress_health_check=list(HealthCheck))
    @given(cases())
    def prop(case):
        drawn.append(case)

    prop()
    on = [c for c in drawn if c.config.prefix_cache]
    assert 0 < len(on) < len(drawn)
    shared = sum(1 for c in on for r in c.workload.requests[1:]
                 if any(r.prompt[:2] == o.prompt[:2] and len(o.prompt) >= 2 and r.rid > o.rid
                        for o in c.workload.requests))
    assert shared


def test_run_prefix_cache_flag(capsys):
    args = ["run", "--prefix-cache", "--pool-tokens", "80", "--row-width", "28",
            "--max-running", "4", "--chunk-size", "6", "--page-size", "2", "--requests", "10",
            "--seed", "3", "--json"]
    assert main(args) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["run"]["config"]["prefix_cache"] is True and doc["run"]["status"] == "completed"
    assert doc["violations"] == [] and doc["problems"] == []


def test_a_batch_stages_more_cells_than_the_pool_holds():
    """Three requests admitted in one prefill batch, each adopting a shared prefix, stage
    more table cells than a pool of 28 slots has (the shared ones are references, not
    allocations): a 10-minute clean campaign's crash, where the staging buffer was
    sized by the pool alone."""
    cfg = EngineConfig(page_size=1, pool_tokens=28, row_width=24, max_running=2, chunk_size=8,
                       spec_steps=1, zero_bubble=True, prefix_cache=True)
    wl = Workload((RequestSpec(0, 0, (0,) * 7, 20), RequestSpec(1, 0, (0,), 1),
                   RequestSpec(2, 0, (0,) * 13, 20), RequestSpec(3, 0, (0,) * 16, 20)))
    out = execute(Case(cfg, wl, ScheduleSpec("stalls", 0, ())))
    assert out.status == "completed" and not out.findings, out.findings[0].text
