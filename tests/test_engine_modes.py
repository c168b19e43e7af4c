"""The seeds' engine variants: the verify sync on or off (seed 001) and the KV backup
stream with its host pool (seed 003). Each mode is race-free, keeps parity and the
pool formula, and costs exactly the syncs it declares; the host pool is really
written and really accounted for."""
import dataclasses

import pytest

from fake_models import make_model
from invariants.kv_accounting import KVAccounting
from overlapcheck.device import make_runtime
from overlapcheck.engine import Engine, EngineConfig
from overlapcheck.protocol import events as E
from overlapcheck.protocol import generate
from overlapcheck.run import Case, ScheduleSpec, execute

from engine_checks import assert_parity, run_clean

BASE = EngineConfig(page_size=2, pool_tokens=120, row_width=40, max_running=3, chunk_size=8,
                    spec_steps=3)
MODES = {
    "verify-sync": {"verify_sync": True},
    "kv-backup": {"kv_backup": True},
    "kv-backup-eagle": {"kv_backup": True, "draft_kind": "eagle"},
    "kv-backup-mtp-nospec": {"kv_backup": True, "draft_kind": "mtp", "spec": False},
    "both": {"kv_backup": True, "verify_sync": True, "draft_kind": "mtp"},
}
SCHEDULES = (ScheduleSpec("random", 3), ScheduleSpec("stalls", 0, (("forward", 0, 10 ** 9),)),
             ScheduleSpec("stalls", 0, (("backup", 0, 10 ** 9),)),
             ScheduleSpec("stalls", 0, (("copy", 0, 10 ** 9),)))


@pytest.mark.parametrize("mode", sorted(MODES))
def test_mode_is_clean_under_every_checker_and_lagging_streams(mode):
    cfg = dataclasses.replace(BASE, **MODES[mode])
    for seed in range(3):
        wl = generate(seed, 7, cfg, max_prompt=10, max_new=14)
        for sched in SCHEDULES:
            out = execute(Case(cfg, wl, sched))
            assert not out.findings, f"{mode} seed {seed} {sched}: {out.findings[0].text}"


@pytest.mark.parametrize("mode", sorted(MODES))
def test_mode_keeps_parity_with_the_standard_engine(mode):
    cfg = dataclasses.replace(BASE, **MODES[mode])
    std = dataclasses.replace(cfg, verify_sync=False, kv_backup=False, overlap=False)
    for seed in range(3):
        wl = generate(seed, 6, cfg, max_prompt=10, max_new=14)
        ref = run_clean(std, wl, seed, "random")
        got = run_clean(cfg, wl, seed, "random")
        assert_parity(ref, got, f"{mode} seed {seed}")


def _syncs(cfg, wl):
    rt = make_runtime("sim", seed=0, strategy="random")
    eng = Engine(cfg, rt, make_model(cfg.model))
    res = eng.run(wl)
    assert rt.syncs == eng.worker.declared_syncs
    return res.summary.declared_syncs, res.summary.batches


def test_verify_sync_costs_one_declared_sync_per_overlapped_decode_and_nothing_else():
    wl = generate(1, 6, BASE, max_prompt=10, max_new=14)
    off, batches = _syncs(BASE, wl)
    on, _ = _syncs(dataclasses.replace(BASE, verify_sync=True), wl)
    assert off == batches                       # one copy-done wait per batch
    assert batches < on < 2 * batches           # plus one per decode after a decode
    for extra in ({"overlap": False}, {"spec": False}):
        a, _ = _syncs(dataclasses.replace(BASE, **extra), wl)
        b, _ = _syncs(dataclasses.replace(BASE, verify_sync=True, **extra), wl)
        assert a == b, extra                    # nothing to wait for: no extra sync


def test_kv_backup_copies_each_accepted_position_to_the_host_pool():
    cfg = dataclasses.replace(BASE, kv_backup=True, max_running=2)
    wl = generate(2, 2, cfg, max_prompt=6, max_new=30)
    rt = make_runtime("sim", seed=0, strategy="random")
    eng = Engine(cfg, rt, make_model(cfg.model))
    for spec in wl.requests:
        spec = dataclasses.replace(spec, arrival=0)
        eng.add(spec)
    checked = 0
    for _ in range(8):
        eng.step()
        dev = eng.dev
        kv, hkv = rt.to_host(dev.target_kv, dev.fwd), rt.to_host(dev.host_kv, dev.backup)
        table, htable = rt.to_host(dev.table, dev.fwd), rt.to_host(dev.host_table, dev.fwd)
        for r in eng.requests.values():
            if r.done or r.row is None or not r.accept_lens:
                continue
            # positions committed by processed decodes; the last one is the next input
            for pos in range(len(r.spec.prompt), r.committed - 1):
                assert (hkv[htable[r.row, pos]] == kv[table[r.row, pos]]).all(), (r.rid, pos)
                checked += 1
    assert checked > 10
    eng.run(type(wl)((), ()))
    assert eng.mem.is_full() and not rt.reports


def _snap(**host) -> E.Snapshot:
    return E.Snapshot(total=10, free=10, owned=0, pending=0, ledger=(), pending_slots=(),
                      requests=(), inflight=(), rows_free=1, idle=True, syncs=0,
                      declared_syncs=0, rows_total=1, **host)


def test_kv_accounting_checks_the_host_pool():
    chk = KVAccounting()
    assert chk.on_StepEnd(E.StepEnd(3, -1, _snap(host_total=8, host_free=8))) == []
    bad = chk.on_StepEnd(E.StepEnd(4, -1, _snap(host_total=8, host_free=5)))
    assert [v.site for v in bad] == [("host-formula",)] and "free 5 + held 0" in str(bad[0])
    chk = KVAccounting()
    leak = chk.on_StepEnd(E.StepEnd(5, -1, _snap(host_total=8, host_free=6, host_ledger=(
        (4, 7, "backup", 2), (5, 7, "backup", 2)))))
    assert len(leak) == 1 and leak[0].site == ("leak", "host-pool")
    assert "request 7" in str(leak[0]) and "step 2" in str(leak[0])


def test_host_pool_leak_is_caught_end_to_end():
    """A release that forgets the host pages: kv-accounting names the request."""
    class Forgetful(Engine):
        def _teardown(self, r, state, reason, bid):
            r.host_pages = []          # planted: the host pages are never released
            super()._teardown(r, state, reason, bid)

    from overlapcheck.run import run_checked
    cfg = dataclasses.replace(BASE, kv_backup=True)
    wl = generate(0, 3, cfg, max_prompt=6, max_new=8)
    run = run_checked(cfg, wl, ("kv-accounting",), engine=Forgetful)
    assert any(v.site == ("leak", "host-pool") for v in run.violations), run.violations
    clean = run_checked(cfg, wl, ("kv-accounting",))
    assert not clean.violations


def test_cli_run_modes(capsys):
    from overlapcheck.cli import main
    for flags in (["--verify-sync"], ["--kv-backup"]):
        assert main(["run", "--requests", "4", *flags]) == 0, flags
