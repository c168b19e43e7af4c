"""The SGLang target on SGLang 0.5.23's real scheduler (skipped where SGLang is missing;
the missing-SGLang and bad-config tests run everywhere)."""
from dataclasses import replace

import pytest

from overlapcheck.device.sched import Eager, Replay, Stalls
from overlapcheck.engine import EngineConfig, generate
from overlapcheck.targets.base import TargetUnavailable
from overlapcheck.targets.sglang import SglangConfig, SglangTarget
from overlapcheck.targets.sglang.config import from_dict

CHECKS = ["kv-accounting", "lifecycle", "liveness", "metrics"]


def test_bad_config_is_one_line():
    with pytest.raises(ValueError) as e:
        SglangConfig(page_size=3)
    assert "\n" not in str(e.value) and "page_size" in str(e.value)
    with pytest.raises(ValueError, match="unknown field 'pagesize'"):
        from_dict({"pagesize": 2})
    with pytest.raises(ValueError, match="unknown fault"):
        SglangConfig(faults=("nope",))


def test_missing_sglang_is_target_unavailable(monkeypatch):
    from importlib import metadata
    real = metadata.version

    def fake(name):
        if name == "sglang":
            raise metadata.PackageNotFoundError(name)
        return real(name)
    monkeypatch.setattr(metadata, "version", fake)
    with pytest.raises(TargetUnavailable) as e:
        SglangTarget().version()
    assert "pip install" in str(e.value) and "\n" not in str(e.value)


def _workload(seed, n=8):
    return generate(seed=seed, n=n, cfg=EngineConfig(), vocab=64, max_prompt=30, max_new=30)


def _run(cfg, wl, strategy=None, extra=()):
    from invariants.base import feed_all, make_checkers
    from invariants.sglang_golden import SglangGolden
    t = SglangTarget()
    checkers = make_checkers(CHECKS) + [SglangGolden(golden=t.golden(cfg))]
    events, found = [], []

    def observer(ev):
        events.append(ev)
        found.extend(feed_all(checkers, ev))
    session = t.open(cfg, strategy or Eager(), observer)
    if cfg.faults:       # SGLang's own idle check may raise on a leak after we saw it
        try:
            result = session.run(wl)
        except Exception:
            result = None
    else:
        result = session.run(wl)
    for c in checkers:
        found.extend(c.finish())
    return result, events, found, session.choices


@pytest.fixture(scope="module")
def sglang():
    pytest.importorskip("sglang")
    SglangTarget().version()


@pytest.mark.parametrize("spec", [0, 2])
def test_overlap_equals_normal_and_golden(sglang, spec):
    for seed in range(3):
        wl = _workload(seed)
        ov, _, f1, _ = _run(SglangConfig(spec_steps=spec), wl)
        nm, _, f2, _ = _run(SglangConfig(spec_steps=spec, overlap=False), wl)
        assert f1 == [] and f2 == [], (f1 + f2)[:3]
        for rid, a in ov.requests.items():
            b = nm.requests[rid]
            if "abort" in (a.finish_reason, b.finish_reason):
                # an abort meets its request one batch later or earlier under overlap
                short, long_ = sorted((a.tokens, b.tokens), key=len)
                assert long_[:len(short)] == short
            else:
                assert (a.tokens, a.finish_reason, a.accept_lens) == \
                       (b.tokens, b.finish_reason, b.accept_lens)
        assert ov.summary.tokens > 0


def test_spec_tokens_equal_no_spec(sglang):
    wl = _workload(4)
    a = _run(SglangConfig(spec_steps=3), wl)[0]
    b = _run(SglangConfig(spec_steps=0), wl)[0]
    assert {r: x.tokens for r, x in a.requests.items()} == {r: x.tokens for r, x in b.requests.items()}
    assert a.summary.mean_accept_length > 1.0


def test_same_seed_same_event_stream_and_replay(sglang):
    wl = _workload(5)
    cfg = SglangConfig(spec_steps=2, page_size=4, pool_tokens=256)
    stalls = Stalls([("recv", 2, 6), ("overlap", 3, 9), ("decode", 10, 12)])
    _, ev1, f1, choices = _run(cfg, wl, stalls)
    _, ev2, _, _ = _run(cfg, wl, Stalls([("recv", 2, 6), ("overlap", 3, 9), ("decode", 10, 12)]))
    assert [repr(e) for e in ev1] == [repr(e) for e in ev2]
    _, ev3, _, _ = _run(cfg, wl, Replay(choices))
    assert [repr(e) for e in ev3] == [repr(e) for e in ev1]
    assert f1 == [], f1[:3]


def test_pressure_aborts_and_forced_retraction_stay_clean(sglang):
    cfg = SglangConfig(spec_steps=1, pool_tokens=256, max_running=6)
    for seed in range(3):
        wl = generate(seed=seed, n=12, cfg=EngineConfig(), vocab=64, max_prompt=60,
                      max_new=60, abort_rate=0.4)
        res, events, found, _ = _run(cfg, wl, Stalls([("decode", 5, 8), ("recv", 9, 12)]))
        assert found == [], found[:3]
        assert res.summary.aborts > 0


FAULT_CASES = [
    ("overalloc-leak", SglangConfig(spec_steps=2), "kv-accounting"),
    ("delayed-token-double-free", SglangConfig(spec_steps=0), "kv-accounting"),
    ("length-before-stop", SglangConfig(spec_steps=3), "lifecycle"),
]


@pytest.mark.parametrize("fault,cfg,checker", FAULT_CASES)
def test_fault_caught_by_its_checker_and_clean_engine_quiet(sglang, fault, cfg, checker):
    caught = 0
    for seed in range(12):
        assert _run(cfg, _workload(seed, n=10))[2] == []
    for seed in range(12):
        wl = _workload(seed, n=10)
        found = _run(replace(cfg, faults=(fault,)), wl)[2]
        caught += any(v.checker == checker for v in found)
    assert caught >= 1


def test_real_forward_tiny_llama(sglang):
    wl = generate(seed=1, n=2, cfg=EngineConfig(), vocab=64, max_prompt=8, max_new=4)
    for ov in (True, False):
        res, events, found, _ = _run(SglangConfig(model="real", overlap=ov), wl)
        kinds = [type(e).__name__ for e in events]
        assert all(r.tokens for r in res.requests.values())
        assert [v for v in found if v.checker != "sglang-golden"] == []
        assert "Finished" in kinds
