"""The sim's host twins are held to the torch kernels a GPU runs (device/twins.py): a
checked run (``twins: check``, an eighth of the fuzzer's examples) finds a kernel edited
without its twin, and a twin edited without its kernel; a twin that raises where its
kernel runs is a finding, never a silent fallback; a correct run checked is clean and
runs what the unchecked one runs."""
import dataclasses

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings

from overlapcheck.device import make_runtime
from overlapcheck.device.twins import TwinMismatch
from overlapcheck.engine import EngineConfig
from overlapcheck.engine import kernels as K
from overlapcheck.engine import kernels_host  # noqa: F401 - registers the twins on the kernels
from overlapcheck.fuzz.campaign import Campaign, Options
from overlapcheck.fuzz.strategies import cases
from overlapcheck.protocol import generate
from overlapcheck.repro import load, replay
from overlapcheck.run import Case, ScheduleSpec, execute
from overlapcheck.run.case import CaseError

pytestmark = pytest.mark.usefixtures("one_thread")

CFG = EngineConfig(row_width=48, pool_tokens=256)


def _accept_without_bonus(drafts, tgt, out_tok, out_acc, k, b):
    """``kernels.accept`` with its accept length edited: the bonus token is dropped
    where every draft matched (the twin, untouched, keeps it)."""
    match = (drafts[:b, 1:k + 1] == tgt[:b, :k]).long()
    out_acc[:b] = torch.cumprod(match, 1).sum(1).clamp(max=k - 1) + 1
    out_tok[:b, :k + 1] = tgt[:b, :k + 1]


_accept_without_bonus.host_twin = K.accept.host_twin


@pytest.fixture
def kernel_edited(monkeypatch):
    monkeypatch.setattr(K, "accept", _accept_without_bonus)


@pytest.fixture
def twin_edited(monkeypatch):
    real = K.accept.host_twin

    def twin(drafts, tgt, out_tok, out_acc, k, b):
        real(drafts, tgt, out_tok, out_acc, k, b)
        out_acc[:b] = out_acc[:b].clip(max=k)      # the twin's bonus dropped
    monkeypatch.setattr(K.accept, "host_twin", twin)


def _case(twins, **cfg):
    c = dataclasses.replace(CFG, **cfg)
    return Case(c, generate(3, 6, c, max_prompt=12, max_new=16), ScheduleSpec("random", 2),
                twins=twins)


def _mismatch(out):
    return [f for f in out.findings if f.key[1] == TwinMismatch.__name__]


def test_a_kernel_edited_without_its_twin_is_found_only_when_checked(kernel_edited):
    assert not _mismatch(execute(_case("run")))          # the twin ran: the edit unseen
    out = execute(_case("check"))
    [f] = _mismatch(out)
    assert out.status == "crashed"
    assert "kernel 'test_twin_check._accept_without_bonus' and its host twin disagree: " \
        "'out_acc' ([8] int64): 1 element(s) differ, first at [0]: kernel 3, twin 4" in f.text, \
        f.text


def test_a_twin_edited_without_its_kernel_is_found(twin_edited):
    [f] = _mismatch(execute(_case("check")))
    assert "kernel 'overlapcheck.engine.kernels.accept'" in f.text, f.text
    assert "'out_acc' ([8] int64)" in f.text and "kernel 4, twin 3" in f.text, f.text


def test_a_checked_run_is_clean_and_runs_what_the_kernels_run():
    for cfg in ({}, {"draft_kind": "eagle", "zero_bubble": True}, {"draft_kind": "mtp"},
                {"topk": 3, "spec_steps": 3}, {"kv_backup": True, "future_map": "ring"}):
        outs = {t: execute(_case(t, **cfg)) for t in ("check", "off")}
        assert outs["check"].status == "completed" and not outs["check"].findings, cfg
        assert outs["check"].digest == outs["off"].digest, cfg
        assert outs["check"].choices == outs["off"].choices, cfg


def _launch(rt, kernel, twin):
    """``kernel`` with ``twin`` launched once on a fresh buffer of ``rt``."""
    kernel.host_twin = twin
    s = rt.new_stream("s")
    buf = rt.empty((4,), torch.int64, "x", s)
    rt.launch(s, kernel, buf.t, name="k", writes=[buf])


def test_a_twin_that_raises_where_its_kernel_runs_is_a_finding():
    rt = make_runtime("sim", strategy="eager", access="declared")
    calls = []

    def kernel(t):
        calls.append("kernel")
        t.add_(1)

    def twin(a):
        calls.append("twin")
        raise IndexError("stale index")

    _launch(rt, kernel, twin)
    with pytest.raises(TwinMismatch, match="the twin raised IndexError: stale index; the kernel ran"):
        rt.synchronize()
    assert calls == ["twin", "kernel"]


def test_a_twin_and_kernel_that_both_refuse_give_the_kernels_error():
    for twins in ("run", "check"):
        rt = make_runtime("sim", strategy="eager", access="declared", twins=twins)

        def kernel(t):
            t[torch.tensor([99])] = 1          # out of range: torch refuses

        def twin(a):
            raise IndexError("slot out of range (torch's scatter refuses it)")

        _launch(rt, kernel, twin)
        with pytest.raises(IndexError, match="out of bounds"):
            rt.synchronize()


def test_the_twins_field_of_a_case():
    c = _case("check")
    d = c.to_dict()
    assert d["twins"] == "check" and "twins" not in _case("run").to_dict()
    assert Case.from_dict(d, 2).twins == "check"
    for bad in ("sometimes", True, 1):
        with pytest.raises(CaseError, match="twins: expected one of run, check, off"):
            Case.from_dict({**d, "twins": bad}, 2)
    with pytest.raises(ValueError, match="unknown twins mode 'x'"):
        make_runtime("sim", twins="x")


def test_the_fuzzer_checks_twins_in_an_eighth_of_its_examples():
    drawn = []

    @settings(max_examples=200, phases=(Phase.generate,), database=None, deadline=None,
              suppress_health_check=list(HealthCheck), derandomize=True)
    @given(cases())
    def prop(case):
        drawn.append(case.twins)
        assert not (case.twins == "check" and case.audit)

    prop()
    share = drawn.count("check") / len(drawn)
    assert 0.05 < share < 0.25, share


def test_a_campaign_finds_a_kernel_edited_without_its_twin(kernel_edited, tmp_path):
    got = Campaign(Options(seconds=None, examples=60, seed=1, out=str(tmp_path))).run()
    found = [f for f in got.found.values() if f.finding.key[1] == TwinMismatch.__name__]
    assert found, [f.finding.text for f in got.found.values()]
    r = load(found[0].repro)
    assert r.case.twins == "check"
    assert replay(r).verdict == "reproduced"
