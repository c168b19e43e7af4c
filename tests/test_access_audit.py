"""The access audit (``access="audit"``, ``Case.audit``): a declared launch's accesses
are inferred too, and what its declaration leaves out is a report the access-audit
checker turns into a finding naming the launch, the buffer and the rows; a right
declaration gives nothing, and the detector is still fed the declaration."""
import dataclasses

import pytest
import torch

from invariants.access_audit import AccessAudit
from overlapcheck.device import make_runtime
from overlapcheck.device.audit import UNDECLARED, AuditReport
from overlapcheck.engine import EngineConfig
from overlapcheck.protocol import generate
from overlapcheck.protocol import events as E
from overlapcheck.run import Case, ScheduleSpec, execute
from overlapcheck.run.case import CaseError

CFG = EngineConfig(page_size=2, pool_tokens=96, row_width=32, max_running=4, chunk_size=8,
                   spec_steps=3)


def _rt(access="audit"):
    rt = make_runtime("sim", strategy="eager", access=access)
    return rt, rt.new_stream("schedule"), rt.new_stream("forward")


def test_a_narrow_declaration_is_a_report_naming_launch_buffer_and_rows():
    rt, s, f = _rt()
    kv = rt.empty((8, 2), torch.int64, "kv", f)
    idx = torch.tensor([3, 5])
    rt.launch(f, lambda t, i: t.index_fill_(0, i, 1), kv.t, idx, name="store_kv",
              writes=[kv.rows([0])])
    f.synchronize()                     # no AnnotationError: the audit reports
    reps = [r for r in rt.reports if r.kind == UNDECLARED]
    assert len(reps) == 1
    r = reps[0]
    assert (r.op, r.buffer, r.write, r.rows, r.declared, r.context) == (
        "store_kv", "kv", True, frozenset({3, 5}), frozenset({0}), "forward")
    assert "store_kv" in str(r) and "'kv' rows {3,5}" in str(r)
    assert r.to_json()["rows"] == [3, 5]


def test_a_buffer_left_out_and_a_read_declared_as_nothing_are_reported():
    rt, s, f = _rt()
    a = rt.empty((4,), torch.int64, "a", f)
    b = rt.empty((4,), torch.int64, "b", f)
    rt.launch(f, lambda x, y: y.copy_(x), a.t, b.t, name="copy_ab", writes=[b])
    f.synchronize()
    (r,) = [r for r in rt.reports if r.kind == UNDECLARED]
    assert (r.op, r.buffer, r.write, r.rows, r.declared) == ("copy_ab", "a", False, None, None)
    assert "not declared" in str(r)


def test_a_right_declaration_gives_nothing_and_the_declaration_feeds_the_detector():
    rt, s, f = _rt()
    kv = rt.empty((8, 2), torch.int64, "kv", f)
    idx = torch.tensor([3])
    rt.launch(f, lambda t, i: t.index_fill_(0, i, 1), kv.t, idx, name="w",
              writes=[kv.rows([3])])
    # an unordered read on another stream of a row the declaration holds: a race, as in
    # the declared mode
    rt.launch(s, lambda t: t[3].sum(), kv.t, name="r", reads=[kv.rows([3])])
    rt.synchronize()
    kinds = [r.kind for r in rt.reports]
    assert UNDECLARED not in kinds and "stream-stream" in kinds


def test_the_audit_samples_each_kernel_first_launches_then_at_growing_intervals():
    rt, s, f = _rt()
    kv = rt.empty((8,), torch.int64, "kv", f)
    for i in range(70):
        rt.launch(f, lambda t: t[5].fill_(1), kv.t, name="k", writes=[kv.rows([0])])
    f.synchronize()
    reps = [r for r in rt.reports if r.kind == UNDECLARED]
    assert len(reps) == 5              # launches 0, 1, 4, 16, 64
    rt2, _, f2 = _rt("declared")
    kv2 = rt2.empty((8,), torch.int64, "kv", f2)
    rt2.launch(f2, lambda t: t[5].fill_(1), kv2.t, name="k", writes=[kv2.rows([0])])
    f2.synchronize()
    assert not rt2.reports               # the declared mode trusts the declaration


def test_checker_reports_audits_and_stream_race_leaves_them():
    from invariants.stream_race import StreamRace
    rep = AuditReport("verify", "worker.py:1", "forward", "target_kv", True,
                      frozenset({4, 5}), frozenset({0}))
    ev = E.RaceFound(3, 2, rep)
    (v,) = AccessAudit().feed(ev)
    assert v.checker == "access-audit" and v.key == ("access-audit",) + rep.site
    assert "verify" in v.message and "target_kv" in v.message and "{4,5}" in v.message
    assert "declared rows {0}" in v.expected
    assert StreamRace().feed(ev) == []


def test_fault_declared_kv_slots_shrunk_is_seen_by_the_audit_only():
    """The old checkers are blind to it (the declarations feed them); an audited run of
    the same case reports the KV launches at step 0."""
    wl = generate(1, 6, CFG, max_prompt=10, max_new=16)
    case = Case(CFG, wl, ScheduleSpec("random", 1), faults=("declared-kv-slots-shrunk",))
    assert execute(case).findings == []
    out = execute(dataclasses.replace(case, audit=True))
    audits = [f for f in out.findings if f.checker == "access-audit"]
    assert audits and {f.checker for f in out.findings} == {"access-audit"}
    first = audits[0]
    assert first.step == 0 and "'prefill'" in first.text and "'target_kv'" in first.text


@pytest.mark.parametrize("over", [
    {}, {"draft_kind": "eagle"}, {"draft_kind": "mtp"}, {"kv_backup": True},
    {"zero_bubble": True, "draft_kind": "eagle"}, {"future_map": "ring"},
    {"topk": 2, "row_width": 40, "pool_tokens": 128}, {"prefix_cache": True},
    {"verify_sync": True}, {"spec": False}, {"forward_thread": True}, {"tp": 2}])
def test_clean_engine_audited_gives_nothing(over):
    cfg = dataclasses.replace(CFG, **over)
    for seed in range(2):
        wl = generate(seed, 6, cfg, max_prompt=10, max_new=16)
        out = execute(Case(cfg, wl, ScheduleSpec("random", seed), audit=True))
        assert not out.findings, out.findings[0].text


def test_case_audit_round_trips_and_is_written_only_when_on():
    wl = generate(1, 2, CFG, max_prompt=4, max_new=4)
    plain = Case(CFG, wl)
    assert "audit" not in plain.to_dict()
    on = dataclasses.replace(plain, audit=True)
    d = on.to_dict()
    assert d["audit"] is True and Case.from_dict(d) == on
    with pytest.raises(CaseError, match="audit"):
        Case.from_dict({**d, "audit": "yes"})


def test_the_fuzzer_audits_a_share_of_its_examples_deterministically():
    from hypothesis import HealthCheck, Phase, given, settings
    from overlapcheck.fuzz.strategies import cases
    runs = []
    for _ in range(2):
        seen = []

        @settings(max_examples=80, phases=(Phase.generate,), database=None, deadline=None,
                  derandomize=True, suppress_health_check=list(HealthCheck))
        @given(cases())
        def prop(case):
            seen.append(case.audit)

        prop()
        runs.append(seen)
    assert runs[0] == runs[1]
    assert 0.1 < sum(runs[0]) / len(runs[0]) < 0.45
