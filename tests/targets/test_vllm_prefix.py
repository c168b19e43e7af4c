"""vLLM's automatic prefix caching in the vLLM target: the config field, the case
strategy's share, and (with vLLM) clean runs quiet under every checker with cache hits
happening, the Tracker's mapping of vLLM's block pool onto the prefix-cache events, and
planted block-pool bugs caught by kv-accounting."""
import importlib.util
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from overlapcheck.protocol import events as E
from overlapcheck.targets.vllm import VllmTarget, VllmTargetConfig
from overlapcheck.targets.vllm.strategies import cases, vllm_config, vllm_workload

needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM is not installed")

TARGET = VllmTarget()
SMALL = VllmTargetConfig(num_blocks=16, max_model_len=60, prefix_caching=True)
CLEAN = {
    "async": SMALL,
    "async-deferred": replace(SMALL, defer_block_free=True),
    "async-pp-bs2": replace(SMALL, num_blocks=40, block_size=2, batch_queue=3),
    "sync": replace(SMALL, scheduler="sync", batch_queue=1),
    "sync-nospec-bs1": replace(SMALL, scheduler="sync", batch_queue=1, spec_tokens=0,
                               block_size=1, num_blocks=70),
}


# -- everywhere -----------------------------------------------------------------------------
def test_config_field():
    assert VllmTargetConfig().prefix_caching is False
    d = SMALL.to_dict()
    assert d["prefix_caching"] is True
    assert VllmTargetConfig.from_dict(d) == SMALL
    with pytest.raises(ValueError, match="prefix_caching must be bool"):
        VllmTargetConfig(prefix_caching=1)
    with pytest.raises(ValueError, match="prefix_caching needs runner: fake") as e:
        VllmTargetConfig.from_dict({"runner": "real", "prefix_caching": True})
    assert "\n" not in str(e.value)


def test_generated_workloads_share_prefixes_only_with_the_cache():
    off = TARGET.generate(3, 10, replace(SMALL, prefix_caching=False))
    on = TARGET.generate(3, 10, SMALL)
    assert TARGET.check_workload(on, SMALL) is None
    shared = [r for r in on.requests[1:]
              if any(r.prompt[:SMALL.block_size] == p.prompt[:SMALL.block_size]
                     and len(p.prompt) >= SMALL.block_size
                     for p in on.requests if p.rid < r.rid)]
    assert shared
    assert [r.seed for r in on.requests] == [r.seed for r in off.requests]


def _shares(wl, bs):
    """Requests whose prompt starts with a full block of an earlier prompt, one token
    more than the block at least (so that a hit is possible)."""
    return sum(1 for r in wl.requests if len(r.prompt) > bs and any(
        p.rid < r.rid and len(p.prompt) >= bs and p.prompt[:bs] == r.prompt[:bs]
        for p in wl.requests))


def test_strategy_draws_the_cache_in_a_share_with_shared_prompts():
    seen: dict = {}

    @settings(max_examples=60, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(st.data())
    def draw(data):
        cfg = data.draw(vllm_config())
        wl = data.draw(vllm_workload(cfg))
        assert TARGET.config_from_dict(cfg.to_dict()) == cfg
        assert cfg.workload_error(wl) == ""
        seen.setdefault(cfg.prefix_caching, []).append(_shares(wl, cfg.block_size))

    draw()
    assert set(seen) == {False, True}
    assert sum(1 for n in seen[True] if n) > len(seen[True]) // 3


# -- with vLLM ----------------------------------------------------------------------------
def run(cfg, wl, spec=None, checks=(), log=None, **kw):
    from overlapcheck.run import Case, ScheduleSpec, execute
    return execute(Case(cfg, wl, spec or ScheduleSpec(), tuple(checks), (), "vllm"),
                   log=log, **kw)


class Events:
    def __init__(self):
        self.events = []

    def event(self, ev):
        self.events.append(ev)

    def violation(self, v):
        pass

    def end(self, status, steps):
        pass


def hits(events):
    """Blocks a request locked that another request's tokens filled: cache hits."""
    writer, out = {}, set()
    for ev in events:
        if isinstance(ev, E.Cached):
            writer.update(dict.fromkeys(ev.slots, ev.rid))
        elif isinstance(ev, E.Evicted):
            for s in ev.slots:
                writer.pop(s, None)
        elif isinstance(ev, E.PrefixLocked):
            out.update((ev.rid, s) for s in ev.slots if writer.get(s) != ev.rid)
    return len(out)


def schedule(seed):
    from overlapcheck.run import ScheduleSpec
    return ScheduleSpec("stalls", 0, ()) if seed % 2 == 0 else ScheduleSpec("random", seed)


@needs_vllm
@pytest.mark.parametrize("name", sorted(CLEAN))
def test_clean_runs_with_prefix_caching_are_quiet_and_hit(name):
    cfg, total = CLEAN[name], 0
    for seed in range(3):
        log = Events()
        out = run(cfg, TARGET.generate(seed, 10, cfg), schedule(seed), log=log)
        assert out.status == "completed", (seed, out.status, out.problems)
        assert out.findings == [], (seed, out.findings[0].text)
        total += hits(log.events)
        # a hit admits a request with computed tokens: the fake runner starts there
        last = [ev for ev in log.events if isinstance(ev, E.StepEnd)][-1].snapshot
        assert last.idle and last.free + last.cached == last.total and last.cached
    assert total > 0


@needs_vllm
def test_tracker_maps_a_hit_and_the_pool():
    from overlapcheck.protocol import RequestSpec, Workload
    cfg = replace(SMALL, scheduler="sync", batch_queue=1, spec_tokens=0)
    a = (1, 2, 3, 4, 5, 6, 7, 8, 9)
    wl = Workload((RequestSpec(0, 0, a, 3, (), 0, "greedy"),
                   RequestSpec(1, 8, a[:8] + (20,), 3, (), 0, "greedy")))
    log = Events()
    out = run(cfg, wl, log=log)
    assert out.status == "completed" and out.findings == []
    evs = log.events
    cached0 = [s for ev in evs if isinstance(ev, E.Cached) and ev.rid == 0 for s in ev.slots]
    lock1 = [ev.slots for ev in evs if isinstance(ev, E.PrefixLocked) and ev.rid == 1]
    alloc1 = [s for ev in evs if isinstance(ev, E.Allocated) and ev.rid == 1 for s in ev.slots]
    # request 1 reuses request 0's two full blocks of 4 tokens and allocates the rest
    assert lock1 and lock1[0][:2] == tuple(cached0[:2]) and not set(alloc1) & set(cached0[:2])
    frames = [e for ev in evs if type(ev).__name__ == "VllmFrame" for e in ev.entries
              if e.rid == 1]
    assert frames[0].start == 8 and frames[0].kind == "prefill"
    assert hits(evs) == 2
    snap = [ev for ev in evs if isinstance(ev, E.StepEnd)][-1].snapshot
    assert snap.idle and snap.owned == snap.pending == 0
    assert snap.cached == len(snap.cache_ledger) and all(n == 0 for _, _, n in snap.cache_ledger)


@needs_vllm
def test_strategy_cases_with_the_cache_run_clean_and_hit():
    found: list = []

    @settings(max_examples=10, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(cases(config={"prefix_caching": True}))
    def check(case):
        assert case.config.prefix_caching
        TARGET.check_workload(case.workload, case.config)
        log = Events()
        out = run(case.config, case.workload, case.schedule, log=log)
        assert out.status == "completed", (out.status, [f.text for f in out.problems])
        assert out.findings == [], out.findings[0].text
        found.append(hits(log.events))

    check()
    assert sum(1 for n in found if n) >= 3, found


def _planted(monkeypatch, bad):
    from overlapcheck.targets.vllm.env import load
    load()              # vLLM imported with the target's environment
    from vllm.v1.core.block_pool import BlockPool
    monkeypatch.setattr(BlockPool, "free_blocks", bad(BlockPool.free_blocks))


def _kv_caught(cfg, seeds=range(4)):
    caught = []
    for seed in seeds:
        out = run(cfg, TARGET.generate(seed, 10, cfg), schedule(seed), checks=("kv-accounting",))
        if any(f.checker == "kv-accounting" for f in out.findings):
            caught.append((seed, out.findings[0].text.splitlines()[0]))
    return caught


@needs_vllm
def test_a_leaked_block_reference_is_a_lock_leak(monkeypatch):
    """A free that skips a cached block's reference (its ref_cnt stays up with no
    holder, so it is never evicted): the engine's lock counts exceed the locks live
    requests hold."""
    def bad(free_blocks):
        def leaky(self, ordered_blocks):
            return free_blocks(self, [b for b in ordered_blocks
                                      if b.block_hash is None or b.ref_cnt > 1])
        return leaky
    _planted(monkeypatch, bad)
    caught = _kv_caught(replace(SMALL, scheduler="sync", batch_queue=1))
    assert len(caught) >= 3, caught
    assert any("lock" in text for _, text in caught), caught


@needs_vllm
def test_a_block_freed_while_referenced_is_caught(monkeypatch):
    """A free that drops a shared cached block's count to zero while another request
    still holds it: the block goes to the free queue, is evicted and handed out while
    locked."""
    def bad(free_blocks):
        def eager(self, ordered_blocks):
            blocks = list(ordered_blocks)
            for b in blocks:
                if b.block_hash is not None and b.ref_cnt > 1:
                    b.ref_cnt -= 1
            return free_blocks(self, blocks)
        return eager
    _planted(monkeypatch, bad)
    caught = _kv_caught(replace(SMALL, scheduler="sync", batch_queue=1))
    assert len(caught) >= 3, caught


@needs_vllm
def test_without_the_cache_the_events_are_unchanged():
    """Prefix caching off: no cache event and no cached count, as before the field."""
    cfg = replace(SMALL, prefix_caching=False)
    log = Events()
    out = run(cfg, TARGET.generate(2, 10, cfg), schedule(2), log=log)
    assert out.findings == []
    kinds = (E.Cached, E.Evicted, E.PrefixLocked, E.PrefixReleased)
    assert not any(isinstance(ev, kinds) for ev in log.events)
    assert all(ev.snapshot.cached == 0 for ev in log.events if isinstance(ev, E.StepEnd))
