"""SGLang's own spec-v2 workers (``worker: eagle-v2``, ``worker: frozen-kv-mtp-v2``)
under the run driver: clean runs agree across loops and with the tiny target's own
continuation, the race detector watches SGLang's CUDA path and stays quiet, and each
fault re-created in SGLang's real code is caught by its checker (and, for eagle-v2,
silent without its trigger) (skipped where SGLang is missing; the config and strategy
tests run everywhere)."""
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings

from overlapcheck.protocol.types import GREEDY, RequestSpec
from overlapcheck.protocol.workload import Workload
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


@pytest.mark.parametrize("worker", ["eagle-v2", "frozen-kv-mtp-v2"])
def test_pinned_cases_keep_the_worker_and_draw_the_rest(worker):
    @settings(max_examples=40, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(cases(config={"worker": worker}))
    def check(case):
        cfg = case.config
        assert cfg.worker == worker and cfg.model == "real" and 1 <= cfg.spec_steps <= 4
        assert all(r.sampling == GREEDY for r in case.workload.requests)
        SglangTarget().check_workload(case.workload, cfg)
    check()


def test_fuzz_config_is_refused_where_the_campaign_draws_every_field(tmp_path, capsys):
    from overlapcheck.cli import main
    f = tmp_path / "c.yaml"
    f.write_text("page_size: 2\n")
    assert main(["fuzz", "--target", "reference", "--config", str(f), "--examples", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--config is not an option of target reference" in err[0]


# -- the real worker ------------------------------------------------------------------------

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
    assert FAULTS[fault].checker == checker and "eagle-v2" in FAULTS[fault].extra["worker"]
    assert "fake" not in FAULTS[fault].extra["worker"]
    out = _run(_cfg(), faults=(fault,))
    assert checker in {f.checker for f in out.findings}, out.findings
    races = [f for f in out.findings if f.checker == "stream-race"]
    assert all(site.startswith("sglang/") for f in races for site in f.site[1:]), races
    kw, wl = quiet
    cfg = SglangConfig(**PAIR) if kw is None else _cfg(**kw)
    assert _run(cfg, wl, faults=(fault,)).findings == []


def test_every_real_worker_fault_is_tested():
    from overlapcheck.targets.sglang.faults import FAULTS
    assert sorted(n for n, f in FAULTS.items() if "fake" not in f.extra["worker"]) == \
        sorted(f for f, _, _ in REAL_FAULTS)


# -- the frozen-KV MTP worker ---------------------------------------------------------------
def _mtp(**kw) -> SglangConfig:
    return from_dict(dict({"worker": "frozen-kv-mtp-v2", "spec_steps": 2}, **PAIR, **kw))


def test_frozen_kv_mtp_v2_runs_sglangs_own_worker_in_both_loops_and_clean(sglang):
    """Both loops agree with each other and with transformers' Gemma4 (the golden),
    request 3's prompt being longer than the target's sliding window."""
    from overlapcheck.targets.sglang import checkpoint
    assert len(WL.requests[2].prompt) > checkpoint.GEMMA_WINDOW
    ov = _run(_mtp(spec_steps=4))
    nm = _run(_mtp(spec_steps=4, overlap=False))
    assert ov.findings == [] and nm.findings == [], (ov.findings + nm.findings)[:3]
    assert type(ov.engine.model_worker).__name__ == "FrozenKVMTPWorkerV2"
    assert _tokens(ov.result) == _tokens(nm.result)
    accepts = [a for r in ov.result.requests.values() for a in r.accept_lens]
    assert max(accepts) > 2 and min(accepts) == 1, accepts


def test_frozen_kv_mtp_v2_session_runs_twins_and_the_cuda_path(sglang):
    from overlapcheck.device.sched import Eager
    s = SglangTarget().open(_mtp(page_size=2), Eager(), None)
    try:
        s.run(WL)
    finally:
        s.close()
    assert s.launches.twin["assign_extend_cache_locs_uniform"] > 0 and not s.launches.interpreted
    summary = s.watch.summary()
    assert summary["races"] == 0 and summary["streams"] >= 4 and summary["accesses"] > 1000


def test_the_normal_loop_meets_sglangs_own_40155_without_the_upstream_fix(sglang):
    """SGLang 0.5.23's normal loop hands every spec-v2 worker pp_proxy_tensors
    (scheduler.py l.4827-4829); FrozenKVMTPWorkerV2 does not take it: the call fails
    before the worker runs. The target applies the upstream fix there and only there."""
    import inspect
    from overlapcheck.targets.sglang import env
    from overlapcheck.targets.sglang.real_worker import upstream_fixes
    with env.stubbed():
        from sglang.srt.speculative.frozen_kv_mtp_worker_v2 import FrozenKVMTPWorkerV2
    fn = FrozenKVMTPWorkerV2.forward_batch_generation
    assert "pp_proxy_tensors" not in inspect.signature(fn).parameters
    with pytest.raises(TypeError, match="pp_proxy_tensors"):
        fn(object.__new__(FrozenKVMTPWorkerV2), None, pp_proxy_tensors=None)
    fixed = upstream_fixes("frozen-kv-mtp-v2", overlap=False)
    assert len(fixed) == 1 and "pp_proxy_tensors" in inspect.signature(fixed[0][3]).parameters
    assert upstream_fixes("frozen-kv-mtp-v2", overlap=True) == []
    assert upstream_fixes("eagle-v2", overlap=False) == []


@pytest.mark.parametrize("fault,checker,quiet", REAL_FAULTS)
def test_shared_faults_are_caught_with_the_frozen_kv_mtp_worker(sglang, fault, checker, quiet):
    """The faults re-created for eagle-v2 patch scheduler and release code that this
    worker runs too; each is caught by its checker here as well."""
    out = _run(_mtp(), faults=(fault,))
    assert checker in {f.checker for f in out.findings}, out.findings
