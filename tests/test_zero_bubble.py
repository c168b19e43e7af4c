"""The zero-bubble spec schedule (seed 000): each decode drafts the next round after its
draft-extend and the next decode restores those drafts. Tokens and accept lengths equal
the standard schedule's for every draft kind and schedule, the run is clean under every
checker, it costs no host sync, and the pre-drafted round's KV is reserved. A draft that
reads the host's sequence lengths keeps parity while they are refreshed for the
pre-drafted round; fault 14 (not refreshed) is caught by parity."""
import dataclasses

import pytest
import torch

from fake_models import make_model
from overlapcheck.device import make_runtime
from overlapcheck.engine import Engine, EngineConfig
from overlapcheck.engine.drafts import DRAFT_KINDS
from overlapcheck.protocol import events as E
from overlapcheck.protocol import generate
from overlapcheck.run import Case, ScheduleSpec, execute

from engine_checks import assert_parity, run_clean

BASE = EngineConfig(page_size=2, pool_tokens=120, row_width=40, max_running=3, chunk_size=8,
                    spec_steps=3, zero_bubble=True)
LAG = 10 ** 9
SCHEDULES = (ScheduleSpec("random", 3), ScheduleSpec("pct", 5), ScheduleSpec("buggify", 2),
             ScheduleSpec("stalls", 0, (("forward", 0, LAG),)),
             ScheduleSpec("stalls", 0, (("copy", 0, LAG),)),
             ScheduleSpec("stalls", 0, (("schedule", 0, LAG),)),
             ScheduleSpec("stalls", 0, (("forward", 5, 400), ("copy", 50, 900))))
STALE = "seq-lens-cpu-stale"


def standard(cfg):
    """The standard schedule's reference: drafts at each decode's start, no overlap."""
    return dataclasses.replace(cfg, zero_bubble=False, overlap=False)


@pytest.mark.parametrize("kind", DRAFT_KINDS)
def test_parity_with_the_standard_schedule_under_every_schedule(kind):
    cfg = dataclasses.replace(BASE, draft_kind=kind)
    for seed in range(3):
        wl = generate(seed, 7, cfg, max_prompt=10, max_new=24)
        ref = run_clean(standard(cfg), wl, seed, "random")
        for strategy in ("random", "eager"):
            assert_parity(ref, run_clean(cfg, wl, seed, strategy), f"{kind} seed {seed} {strategy}")
        for sched in SCHEDULES:
            out = execute(Case(cfg, wl, sched))
            assert not out.findings, f"{kind} seed {seed} {sched}: {out.findings[0].text}"
            assert_parity(ref, out.result, f"{kind} seed {seed} {sched}")


MODES = {
    "page-1-tight-pool": {"page_size": 1, "pool_tokens": 60},     # retractions
    "exact-reserve": {"draft_reserve": "exact"},
    "no-overlap": {"overlap": False},
    "kv-backup": {"kv_backup": True, "draft_kind": "eagle"},
    "verify-sync": {"verify_sync": True, "draft_kind": "mtp"},
    "k1": {"spec_steps": 1, "row_width": 24, "pool_tokens": 80},
    "no-spec": {"spec": False},
    "tp2": {"tp": 2},
}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_clean_under_every_checker_with_the_other_variants(mode):
    """Requests run to the context limit too: where the reserve is clamped at the row end
    the next round is drafted at the decode's start instead."""
    cfg = dataclasses.replace(BASE, **MODES[mode])
    for seed in range(3):
        wl = generate(seed, 7, cfg, max_prompt=10, max_new=cfg.max_context)
        ref = run_clean(standard(dataclasses.replace(cfg, tp=1)), wl, seed, "eager")
        for sched in SCHEDULES[:4]:
            out = execute(Case(cfg, wl, sched))
            assert not out.findings, f"{mode} seed {seed} {sched}: {out.findings[0].text}"
            assert_parity(ref, out.result, f"{mode} seed {seed} {sched}")


class Ops:
    """An observer keeping each decode launch's op names, and the decode allocations."""

    def __init__(self):
        self.decodes, self.allocs = [], []

    def __call__(self, ev):
        if isinstance(ev, E.Launched) and ev.kind == "decode":
            self.decodes.append(ev.ops)
        elif isinstance(ev, E.Allocated) and ev.purpose != "prefill":
            self.allocs.append(ev)


def _run(cfg, wl, observer=None):
    rt = make_runtime("sim", seed=1, strategy="random")
    eng = Engine(cfg, rt, make_model(cfg.model), observer)
    res = eng.run(wl)
    assert not rt.reports and rt.syncs == eng.worker.declared_syncs
    return res, eng


def test_no_host_sync_beyond_the_standard_schedules():
    cfg = dataclasses.replace(BASE, pool_tokens=512, row_width=64, max_running=8)
    for kind in DRAFT_KINDS:
        wl = generate(4, 8, cfg, max_prompt=10, max_new=30)
        got, _ = _run(dataclasses.replace(cfg, draft_kind=kind), wl)
        ref, _ = _run(dataclasses.replace(cfg, draft_kind=kind, zero_bubble=False), wl)
        assert got.summary.batches == ref.summary.batches
        assert (got.summary.host_syncs, got.summary.declared_syncs) == (
            ref.summary.host_syncs, ref.summary.declared_syncs) == (ref.summary.batches,) * 2


@pytest.mark.parametrize("kind", DRAFT_KINDS)
def test_decodes_restore_the_round_the_previous_decode_drafted(kind):
    """With room in the rows, a request drafts at a decode's start only on its first
    decode; every decode drafts the next round after its draft-extend."""
    cfg = dataclasses.replace(BASE, draft_kind=kind, pool_tokens=512, row_width=64,
                              max_running=8)
    wl = generate(5, 6, cfg, max_prompt=10, max_new=30)
    obs = Ops()
    _run(cfg, wl, obs)
    first = [ops for ops in obs.decodes if "draft1" in ops]
    extend = "mtp_seed" if kind == "mtp" else "draft_extend"
    assert all(ops[ops.index("next_input") - 1] == extend and "next_draft1" in ops
               for ops in obs.decodes)
    assert len(first) <= len(wl.requests) < len(obs.decodes)
    assert sum("restore" in ops for ops in obs.decodes) >= len(obs.decodes) - len(first)


def test_the_decode_reserve_covers_the_pre_drafted_round():
    """Standalone and EAGLE reserve one round (k+1 positions) more at each request's first
    decode; frozen-KV MTP writes no draft KV and reserves nothing more."""
    def first_reserve(cfg, wl):
        obs = Ops()
        _run(cfg, wl, obs)
        got = {}
        for a in obs.allocs:
            got.setdefault(a.rid, len(a.slots))
        return got

    for kind, extra in (("standalone", 4), ("eagle", 4), ("mtp", 0)):
        cfg = dataclasses.replace(BASE, draft_kind=kind, pool_tokens=512, row_width=64)
        wl = generate(6, 4, cfg, max_prompt=10, max_new=20)
        zb = first_reserve(cfg, wl)
        std = first_reserve(dataclasses.replace(cfg, zero_bubble=False), wl)
        assert zb.keys() == std.keys() and zb
        assert all(zb[rid] - std[rid] == extra for rid in zb), (kind, zb, std)


# -- host sequence lengths ----------------------------------------------------------------

def test_host_lens_cut_changes_a_draft_only_below_the_device_length():
    m = make_model("oracle-hostlens")
    assert m.reads_host_lens and not make_model("oracle").reads_host_lens
    d = torch.tensor([5, 5, 5, 63])
    lens = torch.tensor([10, 10, 10, 7])
    cut = m.host_lens_cut(d, lens, torch.tensor([10, 14, 9, 3]))
    assert cut[:2].tolist() == [5, 5] and cut[2] != 5 and cut[3] != 63
    assert ((cut >= 0) & (cut < m.vocab)).all()


@pytest.mark.parametrize("kind", DRAFT_KINDS)
def test_host_lengths_model_keeps_parity_when_they_are_refreshed(kind):
    """Right host lengths change nothing: the host-lengths oracle gives the plain
    oracle's tokens and accept lengths, zero bubble or not, overlapped or not."""
    for seed in range(3):
        plain = dataclasses.replace(BASE, draft_kind=kind)
        wl = generate(seed, 6, plain, max_prompt=10, max_new=20)
        ref = run_clean(standard(plain), wl, seed, "eager")
        for zb in (True, False):
            for overlap in (True, False):
                cfg = dataclasses.replace(plain, model="oracle-hostlens", zero_bubble=zb,
                                          overlap=overlap)
                out = execute(Case(cfg, wl, SCHEDULES[3]))
                assert not out.findings, f"{kind} {zb} {overlap}: {out.findings[0].text}"
                assert_parity(ref, out.result, f"{kind} seed {seed} zb {zb} overlap {overlap}")


@pytest.mark.parametrize("kind", DRAFT_KINDS)
def test_stale_host_lengths_are_caught_by_parity(kind):
    cfg = dataclasses.replace(BASE, draft_kind=kind, model="oracle-hostlens")
    caught = 0
    for seed in range(3):
        wl = generate(seed, 6, cfg, max_prompt=10, max_new=20)
        for sched in (SCHEDULES[0], SCHEDULES[3]):
            out = execute(Case(cfg, wl, sched, faults=(STALE,)))
            assert all(f.checker == "parity" and "accept length" in f.text
                       for f in out.findings), out.findings[0].text
            caught += bool(out.findings)
    assert caught >= 5, caught


@pytest.mark.parametrize("change", [{"zero_bubble": False}, {"model": "oracle"},
                                    {"spec": False}])
def test_stale_host_lengths_are_silent_without_their_trigger(change):
    cfg = dataclasses.replace(BASE, **{"model": "oracle-hostlens", **change})
    for seed in range(3):
        wl = generate(seed, 6, cfg, max_prompt=10, max_new=20)
        for sched in (SCHEDULES[0], SCHEDULES[3]):
            out = execute(Case(cfg, wl, sched, faults=(STALE,)))
            assert not out.findings, f"{change} seed {seed}: {out.findings[0].text}"


def test_cli_run_zero_bubble(capsys):
    import json

    from overlapcheck.cli import main
    argv = ["run", "--seed", "3", "--requests", "8", "--json", "--draft", "eagle"]
    assert main(argv + ["--zero-bubble", "--model", "oracle-hostlens"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["run"]["config"]["zero_bubble"] is True and not got["violations"]
    assert main(argv + ["--no-overlap"]) == 0
    ref = json.loads(capsys.readouterr().out)
    assert got["requests"] == ref["requests"]
