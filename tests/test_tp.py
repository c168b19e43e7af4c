"""Tensor-parallel logical ranks on the sim: tp=2 gives tp=1's tokens and is clean under
every checker, a run is a function of its seed, a collective some rank never joins is
an exact liveness finding, and rank-agreement catches disagreeing ranks (planted, and
end to end through fault 16)."""
import dataclasses

import pytest
from hypothesis import given, settings

from invariants.rank_agreement import RankAgreement
from overlapcheck.engine import EngineConfig, TPEngine
from overlapcheck.engine.tp import Collective
from overlapcheck.fuzz.strategies import features
from overlapcheck.protocol import events as E
from overlapcheck.protocol import generate
from overlapcheck.run import Case, ScheduleSpec, execute
from overlapcheck.run import run_checked
from overlapcheck.run import run_workload

CFG = EngineConfig(page_size=2, pool_tokens=96, row_width=32, max_running=4, chunk_size=8,
                   spec_steps=3)
FAULT = "rank-local-overlap"


def _wl(seed):
    return generate(seed, 6, CFG, max_prompt=10, max_new=16)


@pytest.mark.parametrize("strategy", ["eager", "random", "pct", "buggify"])
def test_tp2_gives_tp1_tokens_and_is_clean(strategy):
    for seed in range(2):
        for cfg in (dataclasses.replace(CFG, tp=2),
                    dataclasses.replace(CFG, tp=3, overlap=False, page_size=1)):
            ref = run_workload(dataclasses.replace(cfg, tp=1), _wl(seed), seed=seed,
                               strategy=strategy)
            run = run_checked(cfg, _wl(seed), seed=seed, strategy=strategy)
            assert run.status == "completed" and not run.violations, str(run.violations[0])
            assert run.result.requests == ref.requests
            assert run.result.summary.host_syncs == run.result.summary.declared_syncs


def test_every_rank_runs_its_own_engine():
    run = run_checked(dataclasses.replace(CFG, tp=2), _wl(0), seed=0)
    eng = run.engine
    assert isinstance(eng, TPEngine) and [r.rank for r in eng.ranks] == [0, 1]
    other = eng.others[0]
    assert other.dev.fwd is not eng.dev.fwd and other.requests is not eng.requests
    assert other.batches == eng.batches and other.idle and other.mem.is_full()
    assert {rid: r.output for rid, r in other.requests.items()} == \
        {rid: r.output for rid, r in eng.requests.items()}


def test_same_seed_same_digest_and_replay():
    case = Case(dataclasses.replace(CFG, tp=2), _wl(1), ScheduleSpec("random", 5))
    a, b = execute(case), execute(case)
    assert a.digest == b.digest and a.choices == b.choices and not a.findings
    again = execute(case, choices=a.choices)
    assert again.diverged is None and again.digest == a.digest


class DropsAJoin(Collective):
    """Rank 1 never joins the all-reduce of its batch 3 (a rank that skipped it)."""

    def join(self, eng, batch):
        if eng.rank == 1 and batch.bid == 3:
            self.joined[1] += 1          # it moves on as if it had joined
            return
        super().join(eng, batch)


class TPDropsAJoin(TPEngine):
    def __init__(self, cfg, rt, model, observer=None, strict=False):
        super().__init__(cfg, rt, model, observer, strict)
        self.collective = DropsAJoin(rt, cfg.tp)
        for r in self.others:
            r.collective = self.collective


@pytest.mark.parametrize("overlap", [False, True])
def test_a_collective_never_joined_is_a_stuck_wait_not_a_hang(overlap):
    cfg = dataclasses.replace(CFG, tp=2, overlap=overlap)
    run = run_checked(cfg, _wl(0), ["liveness"], seed=0, engine=TPDropsAJoin)
    assert run.status == "stalled"
    (v,) = run.violations
    assert v.site == ("stuck-wait",)
    assert "all-reduce 3 of batch 3" in v.message and "never by rank(s) [1]" in v.message


def _rb(it, rank, rids, overlap=True, kind="decode", bid=None):
    return E.RankBatch(it, it if bid is None else bid, rank, kind, tuple(rids), overlap)


def test_rank_agreement_planted():
    c = RankAgreement()
    assert c.feed(_rb(0, 0, (1, 2))) == [] and c.feed(_rb(0, 1, (1, 2))) == []
    assert c.feed(_rb(1, 0, (1, 2))) == []
    (v,) = c.feed(_rb(1, 1, (1, 2), overlap=False))
    assert v.checker == "rank-agreement" and v.site == ("overlap",) and v.step == 1
    assert "rank 0: decode batch 1 of requests [1, 2], overlapped" == v.expected
    assert "rank 1: decode batch 1 of requests [1, 2], not overlapped" == v.seen
    c.feed(_rb(2, 0, (1, 2)))
    assert c.feed(_rb(2, 1, (3,))) == []        # once per run: the rest are consequences
    c = RankAgreement()
    c.feed(_rb(3, 0, (1, 2)))
    (v,) = c.feed(E.RankBatch(3, -1, 1, "none", (), False))
    assert v.site == ("kind",) and v.seen == "rank 1: no batch"
    assert set(v.details["fields"]) == {"kind", "rids", "overlap", "batch"}
    assert v.details["rank0"]["rids"] == [1, 2] and v.details["other"]["rids"] == []
    (v,) = RankAgreement().feed(_rb(4, 1, (3,)))             # rank 0 never reported
    assert v.site == ("rank0",) and "rank 1" in v.seen


def test_fault_16_caught_by_rank_agreement_then_deadlocks():
    cfg = dataclasses.replace(CFG, tp=2, faults=(FAULT,))
    run = run_checked(cfg, _wl(2), seed=2, strategy="eager")
    first = run.violations[0]
    assert first.checker == "rank-agreement" and first.site == ("overlap",)
    assert "rank 1" in first.seen and "not overlapped" in first.seen
    assert run.status == "stalled"
    stuck = [v for v in run.violations if v.checker == "liveness"]
    assert stuck and "all-reduce" in stuck[0].message and "never by rank(s) [1]" in \
        stuck[0].message and stuck[0].step > first.step


def test_fault_16_is_silent_at_tp1_and_found_by_the_fuzzer_machinery():
    for sched in (ScheduleSpec("stalls"), ScheduleSpec("random", 3)):
        assert not execute(Case(CFG, _wl(2), sched, faults=(FAULT,))).findings
        out = execute(Case(dataclasses.replace(CFG, tp=2), _wl(2), sched, faults=(FAULT,)))
        assert out.findings[0].checker == "rank-agreement"


def test_strategies_draw_tp_2_in_some_examples():
    seen = []

    @settings(settings.get_profile("ci"), max_examples=40, database=None)
    @given(features())
    def prop(feat):
        seen.append(feat.tp)

    prop()
    assert set(seen) == {1, 2} and seen.count(1) > seen.count(2)


def test_config_tp_validated():
    for bad in (0, -1, "2", 1.5, True):
        with pytest.raises(ValueError, match="tp must be a positive integer"):
            EngineConfig(tp=bad)
