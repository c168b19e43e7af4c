"""SGLang's own spec-v2 worker (``worker: eagle-v2``) under the run driver: clean runs
agree across loops and with the tiny target's own continuation, the race detector
watches SGLang's CUDA path and stays quiet, and each fault re-created in SGLang's real
code is caught by its checker and silent without its trigger (skipped where SGLang is
missing; the config and strategy tests run everywhere)."""
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings

from overlapcheck.engine.types import GREEDY, RequestSpec
from overlapcheck.engine.workload import Workload
from overlapcheck.run import Case, ScheduleSpec, execute
from overlapcheck.targets.sglang import SglangConfig, SglangTarget
from overlapcheck.targets.sglang.config import from_dict
from overlapcheck.targets.sglang.strategies import cases

pytestmark = pytest.mark.usefixtures("one_thread")
PAIR = dict(vocab=32, context=64)


def _cfg(**kw) -> SglangConfig:
    return from_dict(dict({"worker": "eagle-v2", "spec_steps": 2}, **PAIR, **kw))


WL = Workload((RequestSpec(1, 0, (5, 9, 13, 2), 12, (), 0, GREEDY),
               RequestSpec(2, 1, (7, 7, 3), 9, (), 0, GREEDY),
               RequestSpec(3, 2, tuple(range(1, 20)), 15, (), 0, GREEDY)), ())


# -- config and strategy: no SGLang needed --------------------------------------------------
def test_a_real_worker_config_says_what_it_needs():
    cfg = from_dict({"worker": "eagle-v2"})
    assert cfg.real_worker and cfg.model == "real" and cfg.spec_steps == 2
    with pytest.raises(ValueError, match="model must be real"):
        SglangConfig(worker="eagle-v2", spec_steps=2)
    with pytest.raises(ValueError, match="spec_steps must be in 1..4"):
        SglangConfig(worker="eagle-v2", model="real")
    mtp = from_dict({"worker": "frozen-kv-mtp-v2", "spec_steps": 4})
    assert mtp.real_worker and mtp.model == "real" and mtp.spec_steps == 4
    with pytest.raises(ValueError, match="worker must be one of"):
        from_dict({"worker": "eagle"})


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(cases(config={"worker": "eagle-v2"}))
def test_pinned_cases_keep_the_worker_and_draw_the_rest(case):
    cfg = case.config
    assert cfg.worker == "eagle-v2" and cfg.model == "real" and 1 <= cfg.spec_steps <= 4
    assert all(r.sampling == GREEDY for r in case.workload.requests)
    SglangTarget().check_workload(case.workload, cfg)


def test_fuzz_config_is_refused_where_the_campaign_draws_every_field(tmp_path, capsys):
    from overlapcheck.cli import main
    f = tmp_path / "c.yaml"
    f.write_text("page_size: 2\n")
    assert main(["fuzz", "--target", "reference", "--config", str(f), "--examples", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--config is not an option of target reference" in err[0]


# -- the real worker ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sglang():
    pytest.importorskip("sglang")
    SglangTarget().version()


def _run(cfg, wl=WL, faults=()):
    return execute(Case(cfg, wl, ScheduleSpec("stalls", 0, ()), (), tuple(faults), "sglang"))


def _tokens(res):
    return {rid: r.tokens for rid, r in res.requests.items()}


def test_eagle_v2_runs_sglangs_own_worker_watched_and_clean(sglang):
    ov = _run(_cfg())
    nm = _run(_cfg(overlap=False))
    assert ov.findings == [] and nm.findings == [], (ov.findings + nm.findings)[:3]
    assert type(ov.engine.model_worker).__name__ == "EAGLEWorkerV2"
    assert _tokens(ov.result) == _tokens(nm.result)
    accepts = [a for r in ov.result.requests.values() for a in r.accept_lens]
    assert max(accepts) > 1, accepts        # drafts are accepted, not only bonus tokens
    assert ov.result.summary.tokens == sum(len(t) for t in _tokens(ov.result).values()) > 20


def test_the_session_runs_twins_and_the_cuda_path(sglang):
    from overlapcheck.device.sched import Eager
    t = SglangTarget()
    s = t.open(_cfg(), Eager(), None)
    try:
        s.run(WL)
    finally:
        s.close()
    assert sum(s.launches.twin.values()) > 0 and not s.launches.interpreted
    summary = s.watch.summary()
    assert summary["races"] == 0 and summary["streams"] >= 4 and summary["accesses"] > 1000
    # unwatched (detect off), the same tokens
    s2 = t.open(_cfg(), Eager(), None, detect=False)
    try:
        res = s2.run(WL)
    finally:
        s2.close()
    assert s2.watch is None and _tokens(res) == _tokens(_run(_cfg()).result)


PREFILL_ONLY = Workload(tuple(replace(r, max_new_tokens=1) for r in WL.requests), ())

REAL_FAULTS = [
    # (fault, checker, (config, workload) that hides it)
    ("verify-result-no-wait", "stream-race", ({}, PREFILL_ONLY)),    # no decode result
    ("futuremap-relay-unordered", "stream-race", ({"overlap": False}, WL)),
    ("war-barrier-off", "stream-race", ({"overlap": False}, WL)),
    ("d2h-copy-unordered", "stream-race", ({"overlap": False}, WL)),
    ("release-single-reserve", "kv-accounting", (None, WL)),    # no spec: no over-allocation
]


@pytest.mark.parametrize("fault,checker,quiet", REAL_FAULTS)
def test_real_worker_faults_are_caught_by_their_checker(sglang, fault, checker, quiet):
    from overlapcheck.targets.sglang.faults import FAULTS
    assert FAULTS[fault].checker == checker and FAULTS[fault].worker == "eagle-v2"
    out = _run(_cfg(), faults=(fault,))
    assert checker in {f.checker for f in out.findings}, out.findings
    races = [f for f in out.findings if f.checker == "stream-race"]
    assert all(site.startswith("sglang/") for f in races for site in f.site[1:]), races
    kw, wl = quiet
    cfg = SglangConfig(**PAIR) if kw is None else _cfg(**kw)
    assert _run(cfg, wl, faults=(fault,)).findings == []


def test_every_real_worker_fault_is_tested():
    from overlapcheck.targets.sglang.faults import FAULTS
    assert sorted(n for n, f in FAULTS.items() if f.worker == "eagle-v2") == \
        sorted(f for f, _, _ in REAL_FAULTS)
