"""The sim's host runs are held to the kernels a GPU runs (device/twins.py, device/xp.py):
a kernel written once runs its own source on the sim, so an edit to it is what every
run executes; a kernel that keeps a twin is checked against it in a checked run
(``twins: check``, an eighth of the fuzzer's examples), which finds the kernel edited
without its twin and the twin edited without its kernel; a host run that raises where
the kernel runs is a finding, never a silent fallback; a correct run checked is clean
and runs what the unchecked one runs."""
import dataclasses

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings

from overlapcheck.device import api, make_runtime, xp
from overlapcheck.device.twins import TwinMismatch
from overlapcheck.device.xp import NUMPY, of, one_source
from overlapcheck.engine import EngineConfig
from overlapcheck.engine import kernels as K
from overlapcheck.fuzz.campaign import Campaign, Options
from overlapcheck.fuzz.strategies import cases
from overlapcheck.protocol import generate
from overlapcheck.repro import load, replay
from overlapcheck.run import Case, ScheduleSpec, execute
from overlapcheck.run.case import CaseError

pytestmark = pytest.mark.usefixtures("one_thread")

CFG = EngineConfig(row_width=48, pool_tokens=256)
_accept = K.accept


def _accept_twin(drafts, tgt, out_tok, out_acc, k, b):
    """A twin of ``kernels.accept``: a second implementation on numpy, the matching
    prefixes counted a row at a time."""
    for i in range(b):
        a = 1
        while a <= k and drafts[i, a] == tgt[i, a - 1]:
            a += 1
        out_acc[i] = a
    out_tok[:b, :k + 1] = tgt[:b, :k + 1]


def _accept_without_bonus(drafts, tgt, out_tok, out_acc, k, b):
    """``kernels.accept`` with its accept length edited: the bonus token is dropped
    where every draft matched (the twin, untouched, keeps it)."""
    match = (drafts[:b, 1:k + 1] == tgt[:b, :k]).long()
    out_acc[:b] = torch.cumprod(match, 1).sum(1).clamp(max=k - 1) + 1
    out_tok[:b, :k + 1] = tgt[:b, :k + 1]


@one_source
def _accept_one_source_without_bonus(drafts, tgt, out_tok, out_acc, k, b):
    """The same edit in ``kernels.accept``'s one source."""
    xp = of(drafts)
    match = xp.long(drafts[:b, 1:k + 1] == tgt[:b, :k])
    out_acc[:b] = xp.clamp(xp.cumprod(match, 1).sum(1), None, k - 1) + 1
    out_tok[:b, :k + 1] = tgt[:b, :k + 1]


@one_source
def _accept_wrong_on_numpy(drafts, tgt, out_tok, out_acc, k, b):
    """``kernels.accept`` whose source means something else on numpy (as a namespace
    slip would): the bonus is dropped there only."""
    _accept(drafts, tgt, out_tok, out_acc, k, b)
    if of(drafts) is NUMPY:
        out_acc[:b] = NUMPY.clamp(out_acc[:b], None, k)


@pytest.fixture
def twinned(monkeypatch):
    """``kernels.accept`` with a twin registered (``xp.twin``), as a kernel keeps one."""
    monkeypatch.setattr(_accept, "host_run", _accept)     # restored after the test
    monkeypatch.setattr(xp, "TWINNED", [])
    assert xp.twin(_accept)(_accept_twin) is _accept_twin
    assert _accept.host_run is _accept_twin and xp.TWINNED == [_accept]
    _accept_without_bonus.host_run = _accept_twin


@pytest.fixture
def kernel_edited(twinned, monkeypatch):
    monkeypatch.setattr(K, "accept", _accept_without_bonus)


@pytest.fixture
def twin_edited(twinned, monkeypatch):
    def twin(drafts, tgt, out_tok, out_acc, k, b):
        _accept_twin(drafts, tgt, out_tok, out_acc, k, b)
        out_acc[:b] = out_acc[:b].clip(max=k)      # the twin's bonus dropped
    monkeypatch.setattr(_accept, "host_run", twin)


def _case(twins, **cfg):
    c = dataclasses.replace(CFG, **cfg)
    return Case(c, generate(3, 6, c, max_prompt=12, max_new=16), ScheduleSpec("random", 2),
                twins=twins)


def _mismatch(out):
    return [f for f in out.findings if f.key[1] == TwinMismatch.__name__]


def test_every_kernel_the_engine_launches_runs_its_own_source(monkeypatch):
    """No kernel keeps a twin (``xp.TWINNED``): each one the engine launches on the sim,
    in every draft kind and engine mode, runs its own source on numpy views."""
    assert xp.TWINNED == []
    launched = {}
    real = api.Runtime._call

    def spy(self, fn, args, kwargs):
        launched[getattr(fn, "__qualname__", repr(fn))] = fn
        return real(self, fn, args, kwargs)
    monkeypatch.setattr(api.Runtime, "_call", spy)
    for cfg in ({}, {"draft_kind": "eagle", "zero_bubble": True}, {"draft_kind": "mtp"},
                {"topk": 3, "spec_steps": 3}, {"draft_kind": "eagle", "topk": 2},
                {"kv_backup": True, "future_map": "ring"}, {"overlap": False},
                {"prefix_cache": True}):
        assert execute(_case("run", **cfg)).status == "completed", cfg
    kernels = {n: fn for n, fn in launched.items() if getattr(fn, "host_run", None)}
    assert len(kernels) >= 30, sorted(launched)
    for name, fn in kernels.items():
        assert fn.host_run is fn and fn.one_source, name
    assert set(launched) - set(kernels) <= {"TensorBase.zero_"}, sorted(launched)


def test_an_edited_one_source_kernel_is_what_the_sim_runs(monkeypatch):
    """The experiment that once went unseen (the bonus token dropped in
    ``kernels.accept``, while a twin ran in its place): the sim now runs the edited
    source, and a plain run finds it; a checked run runs the same source both ways."""
    monkeypatch.setattr(K, "accept", _accept_one_source_without_bonus)
    for twins in ("run", "check"):
        out = execute(_case(twins))
        assert out.findings and not _mismatch(out), twins
        assert "accept-oracle" in {f.checker for f in out.findings}, \
            [f.text for f in out.findings]


def test_a_source_that_means_something_else_on_numpy_is_found_when_checked(monkeypatch):
    monkeypatch.setattr(K, "accept", _accept_wrong_on_numpy)
    out = execute(_case("check"))
    [f] = _mismatch(out)
    assert "kernel 'test_twin_check._accept_wrong_on_numpy' on numpy and on torch " \
        "disagree: 'out_acc' ([8] int64): 1 element(s) differ, first at [0]: kernel 4, " \
        "twin 3" in f.text, f.text


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
    kernel.host_run = twin
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
