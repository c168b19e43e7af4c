"""End to end on the sim: lossless (spec == no-spec under greedy and seeded sampling),
parity (overlap == non-overlap per request: tokens, and accept lengths by the request's
own verify count; an aborted output is a prefix of the reference's), the pool full at
the end, no race reports, no host syncs beyond the declared copy-done waits."""
import dataclasses

import pytest

from fake_models import OracleModel
from overlapcheck.device import make_runtime
from overlapcheck.engine import Engine, EngineConfig
from overlapcheck.protocol import events as E
from overlapcheck.protocol import generate

from engine_checks import assert_parity, run_clean

STRATEGIES = ("random", "pct", "buggify", "eager")


def _cfg(seed, **kw):
    base = dict(page_size=(1, 4)[seed % 2], pool_tokens=(72, 96, 512)[seed % 3], row_width=64,
                max_running=6, chunk_size=16)
    base.update(kw)
    return EngineConfig(**base)


def check_workload(seed, strategies, n=12, access="declared"):
    cfg = _cfg(seed)
    wl = generate(seed, n, cfg, max_new=30)
    ref = run_clean(dataclasses.replace(cfg, overlap=False), wl, seed, "eager")
    nospec = run_clean(dataclasses.replace(cfg, overlap=False, spec=False), wl, seed, "eager")
    assert_parity(ref, nospec, f"seed {seed} spec vs no-spec", accept=False)
    out = [ref]
    for strategy in strategies:
        got = run_clean(cfg, wl, seed, strategy, access)
        assert_parity(ref, got, f"seed {seed} overlap/{strategy} vs non-overlap")
        out.append(got)
    return out


@pytest.mark.parametrize("seed", range(10))
def test_lossless_and_parity(seed):
    check_workload(seed, (STRATEGIES[seed % 4], STRATEGIES[(seed + 1) % 4]))


def test_ci_set_exercises_retraction_aborts_and_stops():
    seen = {"retract": 0, "abort": 0, "stop": 0, "length": 0}
    for seed in (0, 3, 6):
        for res in check_workload(seed, ("random",)):
            seen["retract"] += res.summary.retractions
            for r in res.requests.values():
                seen[r.finish_reason] = seen.get(r.finish_reason, 0) + 1
    assert all(seen[k] > 0 for k in ("retract", "abort", "stop", "length")), seen


@pytest.mark.parametrize("seed", [1, 2])
def test_parity_with_full_access_inference(seed):
    check_workload(seed, ("random",), n=6, access="infer")


def test_no_spec_and_exact_reserve_overlap_parity():
    cfg = _cfg(4)
    wl = generate(4, 10, cfg, max_new=30)
    ref = run_clean(dataclasses.replace(cfg, overlap=False, spec=False), wl, 4, "eager")
    assert_parity(ref, run_clean(dataclasses.replace(cfg, spec=False), wl, 4, "random"), "no-spec")
    ref = run_clean(dataclasses.replace(cfg, overlap=False, draft_reserve="exact"), wl, 4, "eager")
    got = run_clean(dataclasses.replace(cfg, draft_reserve="exact"), wl, 4, "pct")
    assert_parity(ref, got, "exact reserve")


def test_observer_events_account_for_every_slot():
    """A kv-accounting view built only from events and snapshots."""
    cfg, owned, pending, log = _cfg(3), {}, {}, []

    def observe(ev):
        log.append(ev)
        if isinstance(ev, E.Allocated):
            for s in ev.slots:
                assert s not in owned and s not in pending, f"slot {s} allocated twice"
                owned[s] = ev.rid
        elif isinstance(ev, E.Freed):
            for s in ev.slots:
                assert owned.pop(s) == ev.rid
                if ev.pending:
                    pending[s] = ev.until
        elif isinstance(ev, E.PendingReleased):
            for s in ev.slots:
                assert pending.pop(s) <= ev.batch
        elif isinstance(ev, E.StepEnd):
            snap = ev.snapshot
            assert snap.free + snap.owned + snap.pending == snap.total
            assert snap.owned == len(owned) and snap.pending == len(pending)
            assert set(snap.pending_slots) == set(pending)
            assert snap.syncs == snap.declared_syncs

    res = run_clean(cfg, generate(3, 10, cfg, max_new=30), 3, "random", observer=observe)
    assert not owned and not pending
    kept = {}
    for ev in log:
        if isinstance(ev, E.Verified) and not ev.dropped:
            assert ev.index == kept.get(ev.rid, 0)
            kept[ev.rid] = ev.index + 1
    for rid, r in res.requests.items():
        assert kept.get(rid, 0) == len(r.accept_lens)
    assert any(isinstance(ev, E.Verified) and ev.dropped for ev in log), "no lagged verify seen"


def test_steady_state_decode_has_one_declared_sync_per_step():
    cfg = EngineConfig(pool_tokens=512, row_width=128)
    wl = generate(11, 4, cfg, abort_rate=0.0)
    syncs = []
    rt = make_runtime("sim", seed=11, strategy="random")
    eng = Engine(cfg, rt, OracleModel(), lambda ev: isinstance(ev, E.StepEnd) and syncs.append(
        (ev.snapshot.syncs, ev.snapshot.declared_syncs)))
    eng.run(wl)
    steps = [b - a for (a, _), (b, _) in zip(syncs, syncs[1:])]
    assert max(steps) <= 1 and all(s == d for s, d in syncs)


@pytest.mark.nightly
def test_nightly_200_workloads():
    for seed in range(200):
        check_workload(1000 + seed, (STRATEGIES[seed % 4],), n=16)
